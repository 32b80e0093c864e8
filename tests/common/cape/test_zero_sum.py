"""Tests of dpmarket.common.cape.zero_sum: Algorithm 1's zero-sum property, Lemma 1 and Proposition
1.

Variance tests compare the sample variance of ``n`` independent estimate errors with the theory
through the chi-square law of ``sum x^2 / sigma^2 ~ chi2(n)`` (the mean is known to be 0), with
a two-sided failure probability of 1e-6 per assertion; the ratio of two such variances follows
``F(n, n)``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.privacy import remark3_site_taus, remark3_weights
from dpmarket.common.cape.zero_sum import (
    cape_average,
    cape_release,
    check_zero_sum,
    conv_release,
    draw_gaussian,
    draw_noise_share,
    partial_average_variance,
    secure_aggregation_input,
    sum_noise_shares,
    variances,
    zero_sum_correction,
)
from dpmarket.common.privacy.noise import SeededNoise

FAILURE = 1e-6


def _chi2_interval(n: int) -> tuple[float, float]:
    """Interval for ``mean(x^2) / sigma^2`` with ``n`` samples, failure probability FAILURE."""
    return stats.chi2.ppf(FAILURE / 2, n) / n, stats.chi2.isf(FAILURE / 2, n) / n


def _cape_round(
    stats_per_site: list[np.ndarray],
    taus: list[float],
    noise: SeededNoise,
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """One CAPE round through the site and aggregator functions; returns (a_cape, e_s, e_hat_s)."""
    s = len(stats_per_site)
    m = stats_per_site[0].shape[0]
    e_hats = [draw_noise_share(t, m, noise) for t in taus]
    inputs = [
        secure_aggregation_input(e, None if weights is None else float(weights[j]))
        for j, e in enumerate(e_hats)
    ]
    total = sum_noise_shares(inputs)
    e_s = [
        zero_sum_correction(e, total, s, weight=None if weights is None else float(weights[j]))
        for j, e in enumerate(e_hats)
    ]
    releases = [
        cape_release(f, e, t / np.sqrt(s), noise)
        for f, e, t in zip(stats_per_site, e_s, taus, strict=True)
    ]
    return cape_average(releases, weights), e_s, e_hats


@pytest.mark.parametrize("sites", [2, 5, 20])
def test_noise_shares_sum_to_zero_over_the_averaged_sites(sites: int) -> None:
    noise = SeededNoise(np.random.default_rng(sites))
    f = [np.zeros(300) for _ in range(sites)]
    _, e_s, e_hats = _cape_round(f, [3.0] * sites, noise)
    bound = 1e-12 * sites * float(np.max(np.abs(e_hats)))  # float rounding of S terms
    assert check_zero_sum(e_s, e_hats) <= bound
    assert float(np.max(np.abs(np.sum(e_s, axis=0)))) <= bound


def test_a_site_lost_after_the_noise_round_breaks_the_zero_sum() -> None:
    noise = SeededNoise(np.random.default_rng(1))
    f = [np.zeros(50) for _ in range(5)]
    _, e_s, e_hats = _cape_round(f, [1.0] * 5, noise)
    with pytest.raises(ValueError, match="rerun the noise round"):
        check_zero_sum(e_s[:4], e_hats[:4])
    # rerunning the round over the four survivors restores it
    _, e_s4, e_hats4 = _cape_round(f[:4], [1.0] * 4, noise)
    check_zero_sum(e_s4, e_hats4)


def test_variances_of_the_two_noise_terms() -> None:
    tau_e2, tau_g2 = variances(2.0, 5)
    assert tau_e2 == pytest.approx(0.8 * 4.0)
    assert tau_g2 == pytest.approx(4.0 / 5)
    assert tau_e2 + tau_g2 == pytest.approx(4.0)
    with pytest.raises(ValueError, match="at least 2 sites"):
        variances(1.0, 1)


def test_lemma1_and_proposition1_empirical_variances() -> None:
    """CAPE's estimate has variance tau^2 / S^2 (= tau_pool^2), conv's tau^2 / S (S times more),
    and every single CAPE release has the local variance tau^2."""
    sites, tau, m, runs = 5, 2.0, 2_000, 20
    cape_err, conv_err, release_err = [], [], []
    rng = np.random.default_rng(7)
    for run in range(runs):
        noise = SeededNoise(np.random.default_rng(1_000 + run))
        f = [rng.uniform(0, 1, m) for _ in range(sites)]
        truth = np.mean(f, axis=0)
        a_cape, e_s, _ = _cape_round(f, [tau] * sites, noise)
        cape_err.append(a_cape - truth)
        release_err.append(
            cape_release(f[0], e_s[0], tau / np.sqrt(sites), noise) - f[0]
        )  # a fresh g_0 with the same e_0: one release's noise
        conv = cape_average([conv_release(fs, tau, noise) for fs in f])
        conv_err.append(conv - truth)
    cape_x, conv_x = np.concatenate(cape_err), np.concatenate(conv_err)
    n = cape_x.shape[0]
    lo, hi = _chi2_interval(n)
    tau_pool2 = tau**2 / sites**2
    assert lo <= np.mean(cape_x**2) / tau_pool2 <= hi
    assert lo <= np.mean(conv_x**2) / (tau**2 / sites) <= hi
    ratio = (np.mean(conv_x**2) / np.mean(cape_x**2)) / sites
    assert stats.f.ppf(FAILURE / 2, n, n) <= ratio <= stats.f.isf(FAILURE / 2, n, n)
    rel = np.concatenate(release_err)
    assert lo <= np.mean(rel**2) / tau**2 <= hi


def test_remark3_weighted_round_has_the_pooled_variance() -> None:
    sizes = [100, 300, 600]
    s = len(sizes)
    weights = remark3_weights(sizes)
    tau_pool = 0.01
    taus = remark3_site_taus(tau_pool, sizes).tolist()
    errs = []
    m, runs = 4_000, 10
    for run in range(runs):
        noise = SeededNoise(np.random.default_rng(50 + run))
        f = [np.full(m, float(j)) for j in range(s)]
        a, e_s, e_hats = _cape_round(f, taus, noise, weights)
        check_zero_sum(e_s, e_hats, weights)
        errs.append(a - float(weights @ np.arange(s)))
    x = np.concatenate(errs)
    lo, hi = _chi2_interval(x.shape[0])
    assert lo <= np.mean(x**2) / tau_pool**2 <= hi


@pytest.mark.parametrize(
    ("sizes", "released"),
    [([100] * 5, [0, 1, 3, 4]), ([100, 300, 600, 200], [1, 2]), ([50, 150, 400], [0])],
)
def test_partial_average_variance_is_the_variance_of_an_incomplete_average(
    sizes: list[int], released: list[int]
) -> None:
    """Sites lost between the noise round and their release: the average of the others' releases
    (weights renormalised) has the stated variance, larger than the pooled one."""
    s = len(sizes)
    weights = remark3_weights(sizes)
    weighted = len(set(sizes)) > 1
    taus = remark3_site_taus(0.05, sizes).tolist()
    stated = float(partial_average_variance(weights, taus, released))
    pooled = float(partial_average_variance(weights, taus, range(s)))
    assert pooled == pytest.approx(float(np.sum(weights**2 * np.square(taus))) / s)
    assert stated > pooled
    kept = weights[released] / weights[released].sum()
    errs = []
    m, runs = 4_000, 10
    for run in range(runs):
        noise = SeededNoise(np.random.default_rng(90 + run))
        f = [np.full(m, float(j)) for j in range(s)]
        e_hats = [draw_noise_share(t, m, noise) for t in taus]
        w = [float(x) if weighted else None for x in weights]
        inputs = [secure_aggregation_input(e, wj) for e, wj in zip(e_hats, w, strict=True)]
        total = sum_noise_shares(inputs)
        releases = [
            cape_release(f[j], zero_sum_correction(e_hats[j], total, s, weight=w[j]), t, noise)
            for j, t in enumerate(np.asarray(taus) / np.sqrt(s))
        ]
        estimate = cape_average([releases[j] for j in released], kept)
        errs.append(estimate - float(kept @ np.asarray(released, dtype=float)))
    x = np.concatenate(errs)
    lo, hi = _chi2_interval(x.shape[0])
    assert lo <= np.mean(x**2) / stated <= hi


def test_partial_average_variance_errors() -> None:
    w, t = np.full(3, 1 / 3), np.ones(3)
    with pytest.raises(ValueError, match="distinct site indices"):
        partial_average_variance(w, t, [])
    with pytest.raises(ValueError, match="distinct site indices"):
        partial_average_variance(w, t, [0, 0])
    with pytest.raises(ValueError, match="distinct site indices"):
        partial_average_variance(w, t, [3])
    with pytest.raises(ValueError, match="must match"):
        partial_average_variance(w, np.ones(2), [0])
    with pytest.raises(ValueError, match="> 0"):
        partial_average_variance(-w, t, [0])


def test_draw_gaussian_draws_runs_of_equal_scales_in_order() -> None:
    got = draw_gaussian([1.0, 1.0, 3.0, 3.0, 3.0, 1.0], 6, SeededNoise(np.random.default_rng(3)))
    rng = np.random.default_rng(3)
    expected = np.concatenate(
        [rng.normal(0.0, 1.0, 2), rng.normal(0.0, 3.0, 3), rng.normal(0.0, 1.0, 1)]
    )
    np.testing.assert_array_equal(got, expected)


def test_shape_and_value_errors() -> None:
    with pytest.raises(ValueError, match="shape"):
        zero_sum_correction(np.zeros(3), np.zeros(4), 3)
    with pytest.raises(ValueError, match="at least 2 sites"):
        zero_sum_correction(np.zeros(3), np.zeros(3), 1)
    with pytest.raises(ValueError, match="NaN"):
        cape_release(np.array([np.nan]), np.zeros(1), 1.0, SeededNoise(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="tau"):
        draw_noise_share([1.0, -1.0], 2, SeededNoise(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="sum to 1"):
        cape_average([np.zeros(2), np.zeros(2)], [0.5, 0.6])
    with pytest.raises(ValueError, match="empty"):
        sum_noise_shares([])
