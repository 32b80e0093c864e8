"""Tests of dpmarket.common.cape.dpgd: back-propagation, clipping, sensitivity, accounting,
training."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy.optimize import approx_fprime, brentq

from dpmarket.common.cape.dpgd import (
    accuracy,
    init_params,
    iteration_loss_sigma,
    loss,
    n_params,
    per_example_terms,
    plan_training,
    site_gradient,
    total_epsilon,
    train_dpgd,
    training_loss_sigma,
    training_noise_share,
)
from dpmarket.common.cape.privacy import collusion_factor, exact_delta
from dpmarket.common.privacy.noise import SeededNoise

H, DIM = 4, 3


def _data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n).astype(float)
    x = rng.standard_normal((n, DIM)) + 1.5 * y[:, None]
    return x, y


def test_unclipped_site_gradient_is_the_loss_gradient() -> None:
    x, y = _data(30, 0)
    theta = init_params(DIM, H, np.random.default_rng(1))
    theta[H * DIM : H * DIM + H] = 0.1  # biases away from ReLU kinks
    g = site_gradient(theta, x, y, clip=1e9, hidden=H)
    numeric = approx_fprime(theta, lambda t: loss(t, x, y, H), 1e-7)
    np.testing.assert_allclose(g, numeric, rtol=1e-4, atol=1e-6)


def test_per_example_norms_and_clipping() -> None:
    x, y = _data(12, 2)
    theta = init_params(DIM, H, np.random.default_rng(3))
    _, _, _, norms = per_example_terms(theta, x, y, H)
    for i in range(12):  # each example's gradient is the unclipped gradient on that record
        gi = site_gradient(theta, x[i : i + 1], y[i : i + 1], clip=1e9, hidden=H)
        assert np.linalg.norm(gi) == pytest.approx(norms[i], rel=1e-10)
        clipped = site_gradient(theta, x[i : i + 1], y[i : i + 1], clip=0.05, hidden=H)
        assert np.linalg.norm(clipped) <= 0.05 * (1 + 1e-12)


def test_site_gradient_sensitivity_is_2c_over_n() -> None:
    x, y = _data(25, 4)
    rng = np.random.default_rng(5)
    theta = init_params(DIM, H, rng)
    clip = 0.3
    base = site_gradient(theta, x, y, clip=clip, hidden=H)
    worst = 0.0
    for _ in range(500):
        x2, y2 = x.copy(), y.copy()
        x2[-1] = rng.standard_normal(DIM) * 10
        y2[-1] = float(rng.integers(0, 2))
        diff = site_gradient(theta, x2, y2, clip=clip, hidden=H) - base
        worst = max(worst, float(np.linalg.norm(diff)))
    assert worst <= 2 * clip / 25 * (1 + 1e-12)


def _closed_form_epsilon(ratio: float, delta: float) -> float:
    mu = ratio**2 / 2
    return float(brentq(lambda e: exact_delta(e, mu, ratio) - delta, 0.0, 200.0, xtol=1e-12))


@pytest.mark.parametrize(("ratio", "iterations"), [(0.05, 100), (0.2, 30), (1.0, 5)])
def test_total_epsilon_composes_like_one_gaussian_of_ratio_r_sqrt_t(
    ratio: float, iterations: int
) -> None:
    exact = _closed_form_epsilon(ratio * math.sqrt(iterations), 1e-5)
    pld = total_epsilon(ratio, iterations, 1e-5)
    assert exact * (1 - 1e-6) <= pld <= exact * 1.01  # the PLD is pessimistic, and close


def test_budget_modes() -> None:
    r = iteration_loss_sigma(iterations=50, epsilon_total=1.0, delta_total=1e-5)
    assert total_epsilon(r, 50, 1e-5) == pytest.approx(1.0, rel=1e-2)
    conv = iteration_loss_sigma(
        iterations=50, epsilon_per_iteration=0.5, delta_per_iteration=0.01, scheme="conv"
    )
    cape = iteration_loss_sigma(
        iterations=50, epsilon_per_iteration=0.5, delta_per_iteration=0.01, scheme="cape", sites=4
    )
    assert cape == pytest.approx(conv, rel=1e-6)  # same per-site guarantee, different noise
    with pytest.raises(ValueError, match="either epsilon_total"):
        iteration_loss_sigma(iterations=5)
    with pytest.raises(ValueError, match="either epsilon_total"):
        iteration_loss_sigma(iterations=5, epsilon_total=1.0, epsilon_per_iteration=1.0)


def test_training_schemes_and_noise_levels() -> None:
    sites = [_data(200, s) for s in range(4)]
    x_test, y_test = _data(2_000, 99)
    common: dict[str, Any] = {
        "iterations": 40,
        "learning_rate": 1.0,
        "clip": 1.0,
        "hidden": H,
        "epsilon_total": 1.0,
        "delta_total": 1e-5,
    }
    runs = {
        scheme: train_dpgd(
            sites,
            scheme=scheme,
            rng=np.random.default_rng(0),
            noise=SeededNoise(np.random.default_rng(1)),
            **common,
        )
        for scheme in ("nonprivate", "conv", "cape")
    }
    assert runs["nonprivate"].history[-1] < runs["nonprivate"].history[0]
    assert accuracy(runs["nonprivate"].theta, x_test, y_test, H) > 85  # Bayes: 90.3
    assert runs["nonprivate"].epsilon_total == math.inf
    for scheme in ("conv", "cape"):
        assert runs[scheme].epsilon_total == pytest.approx(1.0, rel=1e-2)
        assert runs[scheme].theta.shape == (n_params(DIM, H),)
    # same per-site loss ratio; CAPE's aggregate noise is S / F times smaller in variance
    ratio = (runs["conv"].aggregator_std / runs["cape"].aggregator_std) ** 2
    assert ratio == pytest.approx(4 / collusion_factor(4), rel=1e-9)
    assert runs["cape"].site_noise[0] == pytest.approx(
        math.sqrt(collusion_factor(4)) * runs["conv"].site_noise[0]
    )


def test_training_is_reproducible_and_validates() -> None:
    sites = [_data(50, s) for s in range(3)]
    kwargs: dict[str, Any] = {
        "scheme": "cape",
        "iterations": 5,
        "learning_rate": 0.5,
        "clip": 1.0,
        "hidden": H,
        "epsilon_per_iteration": 0.5,
        "delta_per_iteration": 1e-3,
    }
    a = train_dpgd(
        sites, rng=np.random.default_rng(0), noise=SeededNoise(np.random.default_rng(7)), **kwargs
    )
    b = train_dpgd(
        sites, rng=np.random.default_rng(0), noise=SeededNoise(np.random.default_rng(7)), **kwargs
    )
    np.testing.assert_array_equal(a.theta, b.theta)
    with pytest.raises(ValueError, match="labels 0 or 1"):
        train_dpgd(
            [(np.zeros((3, DIM)), np.array([0.0, 2.0, 1.0]))] * 2,
            rng=np.random.default_rng(0),
            noise=SeededNoise(np.random.default_rng(0)),
            **kwargs,
        )


# ------------------------------------------------------------------- CAPE training plans
def test_a_training_plan_charges_at_most_the_request_by_the_pld_accountant() -> None:
    """The loss ratio ``r`` composes exactly (Gaussian losses add) to a ratio ``r sqrt(T)``
    that meets the request; the PLD accountant, pessimistic, states a total within 1e-4 of it
    and never above, and that total is what the plan charges."""
    for epsilon, delta, iterations in ((1.0, 1e-5, 50), (0.3, 1e-6, 7), (4.0, 1e-3, 1000)):
        r, stated = training_loss_sigma(epsilon, delta, iterations)
        assert stated == total_epsilon(r, iterations, delta)
        assert epsilon * (1 - 1e-4) <= stated <= epsilon
        total = r * math.sqrt(iterations)
        assert exact_delta(epsilon, 0.5 * total * total, total) <= delta
        plan = plan_training(
            dim=3,
            hidden=4,
            clip=1.0,
            iterations=iterations,
            sizes=[10, 20],
            epsilon=epsilon,
            delta=delta,
        )
        assert (plan.loss_sigma, plan.epsilon) == (r, stated)
        assert plan.sigma_z == pytest.approx(total, rel=1e-12)
        assert plan.delta_exact <= delta


def test_a_training_plan_inflates_each_sites_noise_for_the_colluders_and_keeps_r() -> None:
    """``tau_s = sqrt(F(S, S_C)) (2 C / N_s) / r``; a re-plan over fewer sites from a later
    iteration keeps ``r`` (so every iteration has the same guarantee) and the given ``S_C``."""
    sizes = [40, 60, 100, 200]
    plan = plan_training(
        dim=DIM, hidden=H, clip=0.5, iterations=20, sizes=sizes, epsilon=1.0, delta=1e-5
    )
    assert plan.colluders == 1 and plan.size == n_params(DIM, H)
    assert plan.round_length == 20 * plan.size
    factor = collusion_factor(4, 1)
    np.testing.assert_allclose(
        plan.site_scales, [math.sqrt(factor) * 1.0 / n / plan.loss_sigma for n in sizes]
    )
    later = plan_training(
        dim=DIM,
        hidden=H,
        clip=0.5,
        iterations=20,
        sizes=sizes[:3],
        epsilon=1.0,
        delta=1e-5,
        colluders=plan.colluders,
        first_iteration=12,
    )
    assert later.loss_sigma == plan.loss_sigma and later.colluders == 1
    assert later.round_iterations == 8 and later.round_length == 8 * plan.size
    np.testing.assert_allclose(
        later.site_scales,
        [math.sqrt(collusion_factor(3, 1)) * 1.0 / n / plan.loss_sigma for n in sizes[:3]],
    )
    stds = plan.baseline_stds()
    assert stds["pooled"] == pytest.approx(1.0 / 400 / plan.loss_sigma)
    assert plan.aggregator_std() > stds["pooled"]  # CAPE defends against a colluder too


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sizes": [10]}, "at least 2 sites"),
        ({"first_iteration": 20}, "first_iteration"),
        ({"colluders": 2, "sizes": [10, 10]}, "colluders"),
        ({"clip": 0.0}, "clip"),
        ({"iterations": 0}, "iterations"),
    ],
)
def test_a_malformed_training_plan_is_refused(changes: dict[str, Any], message: str) -> None:
    args: dict[str, Any] = {
        "dim": DIM,
        "hidden": H,
        "clip": 1.0,
        "iterations": 20,
        "sizes": [10, 20],
        "epsilon": 1.0,
        "delta": 1e-5,
    }
    with pytest.raises(ValueError, match=message):
        plan_training(**{**args, **changes})


def test_a_sites_noise_for_a_training_covers_every_iteration_of_the_plan_at_once() -> None:
    plan = plan_training(
        dim=DIM,
        hidden=H,
        clip=1.0,
        iterations=6,
        sizes=[10, 30],
        epsilon=1.0,
        delta=1e-5,
        first_iteration=2,
    )
    draws = training_noise_share(plan, 1, SeededNoise(np.random.default_rng(0)))
    assert draws.shape == (4, plan.size)
    again = np.random.default_rng(0).normal(0.0, plan.site_scales[1], 4 * plan.size)
    np.testing.assert_array_equal(draws.ravel(), again)
