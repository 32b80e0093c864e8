"""Tests of dpmarket.common.cape.capefm: Algorithm 4 across sites, its calibration and the
baselines."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.cape.capefm import (
    BASELINES,
    aggregate_noise_shares,
    aggregate_releases,
    fit_released,
    plan_capefm,
    run_baseline,
    run_capefm,
    secure_aggregation_input,
    site_coefficients,
    site_noise_share,
    site_release,
)
from dpmarket.common.cape.functional_mechanism import (
    fm_coefficients,
    order_scales,
    pack_coefficients,
    scale_to_bounds,
)
from dpmarket.common.cape.privacy import cape_exact_delta, collusion_factor
from dpmarket.common.privacy.noise import SeededNoise

S, D = 5, 8


def _linear_sites(
    n: int, seed: int = 0, sizes: list[int] | None = None
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Synthetic linear data in the domain, split over S sites; returns (sites, w_true)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, D))
    w = rng.standard_normal(D)
    w *= 0.9 / np.abs(w).sum()
    y = x @ w + rng.uniform(-0.1, 0.1, n)
    xs, ys = scale_to_bounds(x, y, np.tile([-1.0, 1.0], (D, 1)), [-1.0, 1.0])
    cuts = np.cumsum(sizes)[:-1] if sizes else np.linspace(0, n, S + 1)[1:-1].astype(int)
    return list(zip(np.split(xs, cuts), np.split(ys, cuts), strict=True)), w * math.sqrt(D)


def _nonprivate_w(sites: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    return run_baseline(
        "nonprivate",
        sites,
        "linear",
        1.0,
        1e-5,
        rng=np.random.default_rng(0),
        noise=SeededNoise(np.random.default_rng(0)),
    ).w


def test_capefm_approaches_the_nonprivate_minimizer_as_epsilon_grows() -> None:
    """Mean relative error over 5 seeds decreases with epsilon and is < 1% at epsilon 1000."""
    sites, _ = _linear_sites(20_000)
    w_np = _nonprivate_w(sites)
    errors = []
    for eps in (0.5, 5.0, 50.0, 1000.0):
        e = [
            np.linalg.norm(
                run_capefm(
                    sites,
                    "linear",
                    eps,
                    1e-5,
                    np.random.default_rng(seed),
                    SeededNoise(np.random.default_rng(seed)),
                ).w
                - w_np
            )
            / np.linalg.norm(w_np)
            for seed in range(5)
        ]
        errors.append(float(np.mean(e)))
    assert errors == sorted(errors, reverse=True), errors
    assert errors[-1] < 0.01, errors


def test_in_process_protocol_matches_the_driver_bit_for_bit() -> None:
    """The documented order of draws: every site's e_hat, the sum, every site's g."""
    sites, _ = _linear_sites(3_000, seed=1)
    result = run_capefm(
        sites, "linear", 1.0, 1e-5, np.random.default_rng(9), SeededNoise(np.random.default_rng(42))
    )
    plan = plan_capefm("linear", D, [x.shape[0] for x, _ in sites], 1.0, 1e-5)
    noise = SeededNoise(np.random.default_rng(42))
    stats_s = [site_coefficients(plan, s, x, y) for s, (x, y) in enumerate(sites)]
    e_hats = [site_noise_share(plan, s, noise) for s in range(S)]
    total = aggregate_noise_shares(
        [secure_aggregation_input(plan, s, e) for s, e in enumerate(e_hats)]
    )
    releases = [site_release(plan, s, stats_s[s], e_hats[s], total, noise) for s in range(S)]
    fit = fit_released(plan, aggregate_releases(plan, releases))
    np.testing.assert_array_equal(fit.w, result.w)
    again = run_capefm(
        sites, "linear", 1.0, 1e-5, np.random.default_rng(0), SeededNoise(np.random.default_rng(42))
    )
    np.testing.assert_array_equal(again.w, result.w)
    assert result.zero_sum_residual < 1e-12 * S * plan.kappa * 10


def test_aggregated_noise_is_the_pooled_mechanisms() -> None:
    """Lemma 1 for capeFM: the averaged coefficients' noise has std tau_j / S (chi-square,
    failure 1e-6), which is the pooled mechanism's noise at the same kappa."""
    sites, _ = _linear_sites(1_000, seed=2)
    sizes = [x.shape[0] for x, _ in sites]
    plan = plan_capefm("linear", D, sizes, 1.0, 1e-5)
    pooled = order_scales(plan.kappa, "linear", sum(sizes), plan.orders)
    assert plan.aggregator_scales() == pytest.approx(pooled, rel=1e-12)
    x_all, y_all = np.vstack([x for x, _ in sites]), np.concatenate([y for _, y in sites])
    exact = pack_coefficients(fm_coefficients(x_all, y_all, "linear"), plan.orders)
    scale = plan.entry_scales(0) / S
    residuals = []
    for seed in range(40):
        noise = SeededNoise(np.random.default_rng(seed))
        stats_s = [site_coefficients(plan, s, x, y) for s, (x, y) in enumerate(sites)]
        e_hats = [site_noise_share(plan, s, noise) for s in range(S)]
        total = aggregate_noise_shares(e_hats)
        releases = [site_release(plan, s, stats_s[s], e_hats[s], total, noise) for s in range(S)]
        residuals.append((aggregate_releases(plan, releases) - exact) / scale)
    r = np.concatenate(residuals)
    assert stats.chi2.ppf(5e-7, r.size) <= float(r @ r) <= stats.chi2.isf(5e-7, r.size)


def test_plan_privacy_report() -> None:
    plan = plan_capefm("linear", D, [400] * S, 1.0, 1e-5)
    assert plan.colluders == 1
    assert plan.delta_exact <= 1e-5
    assert plan.delta_exact == pytest.approx(1e-5, rel=1e-4)
    assert plan.delta_theorem1 is not None and plan.delta_theorem1 > plan.delta_exact
    # sigma_z of the whole release: sqrt(k) / kappa inflated by the collusion factor
    assert plan.sigma_z == pytest.approx(math.sqrt(2) / plan.kappa * math.sqrt(collusion_factor(S)))
    # the per-order site release is one CAPE release of sensitivity sqrt(k) after normalization
    assert cape_exact_delta(1.0, sites=S, tau=plan.kappa, sensitivity=math.sqrt(2)) <= 1e-5
    thm1 = plan_capefm("linear", D, [400] * S, 1.0, 1e-5, calibration="theorem1")
    assert thm1.kappa > plan.kappa
    assert thm1.delta_theorem1 == pytest.approx(1e-5, rel=1e-4)
    # Section 5.2's calibration ignores composition and collusion: its real delta is larger
    paper = plan_capefm("linear", D, [400] * S, 1.0, 1e-5, calibration="paper")
    assert paper.delta_exact > 1e-5


def test_unequal_sites_use_remark3_weights() -> None:
    sizes = [500, 1_000, 1_500, 2_000, 3_000]
    sites, _ = _linear_sites(sum(sizes), seed=3, sizes=sizes)
    res = run_capefm(
        sites, "linear", 2.0, 1e-5, np.random.default_rng(0), SeededNoise(np.random.default_rng(1))
    )
    plan = res.plan
    assert plan.weighted
    np.testing.assert_allclose(plan.weights, np.array(sizes) / sum(sizes))
    pooled = order_scales(plan.kappa, "linear", sum(sizes), plan.orders)
    assert plan.aggregator_scales() == pytest.approx(pooled, rel=1e-12)
    assert res.zero_sum_residual < 1e-9
    assert np.all(np.isfinite(res.w))


def test_baselines_run_on_the_same_data() -> None:
    sites, w_true = _linear_sites(5_000, seed=4)
    w_np = _nonprivate_w(sites)
    assert np.linalg.norm(w_np - w_true) < 0.1 * np.linalg.norm(w_true)
    for method in BASELINES:
        if method == "objpert":
            with pytest.raises(ValueError, match="bounded"):
                run_baseline(
                    method,
                    sites,
                    "linear",
                    1.0,
                    1e-5,
                    rng=np.random.default_rng(0),
                    noise=SeededNoise(np.random.default_rng(0)),
                )
            continue
        fit = run_baseline(
            method,
            sites,
            "linear",
            1.0,
            1e-5,
            rng=np.random.default_rng(0),
            noise=SeededNoise(np.random.default_rng(0)),
        )
        assert fit.w.shape == (D,) and np.all(np.isfinite(fit.w)), method


def test_logistic_capefm_and_objpert() -> None:
    rng = np.random.default_rng(5)
    n = 10_000
    x = rng.uniform(-1, 1, (n, D))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * x[:, 0] + 2 * x[:, 1]))).astype(float)
    xs, ys = scale_to_bounds(x, y, np.tile([-1.0, 1.0], (D, 1)), None, task="logistic")
    sites = list(zip(np.array_split(xs, S), np.array_split(ys, S), strict=True))
    res = run_capefm(sites, "logistic", 5.0, 1e-5, rng, SeededNoise(rng))
    assert res.plan.orders == (1, 2)
    ref = run_baseline(
        "nonprivate", sites, "logistic", 1.0, 1e-5, rng=rng, noise=SeededNoise(rng)
    ).w
    assert np.sign(res.w[0]) == np.sign(ref[0]) and np.sign(res.w[1]) == np.sign(ref[1])
    op = run_baseline("objpert", sites, "logistic", 5.0, 1e-5, rng=rng, noise=SeededNoise(rng))
    assert np.all(np.isfinite(op.w))


def test_a_missing_release_must_be_named() -> None:
    """Averaging fewer releases than the round's sites needs the indices of those that released
    (whose larger noise the plan then states)."""
    plan = plan_capefm("linear", D, [200] * S, 1.0, 1e-5)
    releases = [np.full(plan.size, float(j)) for j in range(S - 1)]
    with pytest.raises(ValueError, match="pass the indices of the sites that released"):
        aggregate_releases(plan, releases)
    with pytest.raises(ValueError, match="in order"):
        aggregate_releases(plan, releases, [1, 0, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        aggregate_releases(plan, releases, [1, 2, 3, S])
    kept = [0, 1, 3, 4]
    np.testing.assert_allclose(aggregate_releases(plan, releases, kept), np.full(plan.size, 1.5))
    assert plan.aggregator_scales(kept)[2] > plan.aggregator_scales()[2]


def test_out_of_bounds_record_at_a_site_raises() -> None:
    rng = np.random.default_rng(7)
    raw = [(rng.uniform(0, 1, (50, 3)), rng.uniform(0, 1, 50)) for _ in range(3)]
    raw[2][0][17, 1] = 1.5
    with pytest.raises(ValueError, match="site 2: feature value out of bounds at row 17, column 1"):
        run_capefm(
            raw,
            "linear",
            1.0,
            1e-5,
            rng,
            SeededNoise(rng),
            feature_bounds=[[0, 1]] * 3,
            target_bounds=[0, 1],
        )
    # data not scaled into the domain is refused by the site
    with pytest.raises(ValueError, match=r"\|\|x\|\|_2"):
        run_capefm(
            [(np.full((10, 3), 0.9), np.zeros(10))] * 2, "linear", 1.0, 1e-5, rng, SeededNoise(rng)
        )


def test_the_stated_baseline_noise_is_the_baselines_noise() -> None:
    """The plan's ``baseline_scales`` are the noise :func:`run_baseline` adds: the pooled
    mechanism's per-order scales and conv's weighted order-2 std at the aggregator; with equal
    sizes conv has ``sqrt(S)`` times the pooled noise (Proposition 1), and CAPE's aggregator lies
    between them (``sqrt(F)`` times pooled, for the colluders)."""
    sites, _ = _linear_sites(400, 3, sizes=[80] * 5)
    plan = plan_capefm("linear", D, [80] * 5, 1.0, 1e-5)
    stated = plan.baseline_scales()
    common: dict[str, Any] = {
        "rng": np.random.default_rng(0),
        "noise": SeededNoise(np.random.default_rng(1)),
    }
    pooled = run_baseline("pooled", sites, "linear", 1.0, 1e-5, **common)
    conv = run_baseline("conv", sites, "linear", 1.0, 1e-5, **common)
    assert stated["pooled"] == pytest.approx(pooled.details["scales"], rel=1e-12)
    assert stated["conv"][2] == pytest.approx(conv.details["aggregator_std2"], rel=1e-12)
    for j in plan.orders:
        assert stated["conv"][j] == pytest.approx(math.sqrt(S) * stated["pooled"][j])
        cape = plan.aggregator_scales()[j]
        assert cape == pytest.approx(math.sqrt(collusion_factor(S)) * stated["pooled"][j])
