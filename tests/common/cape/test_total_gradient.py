"""CAPE gradient descent's per-site gradient is total: finite, of norm at most ``C`` and of
sensitivity ``2 C / N_s`` whatever parameters a curator sends, so whether a record makes some
term overflow is never visible in what the site answers.

The parameters an honest training reaches are bounded (:func:`dpmarket.common.cape.dpgd.
parameter_bound`, what an owner checks before it reads a record), and the specs' public numbers
are within :data:`dpmarket.common.cape.spec.MAX_MAGNITUDE`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from dpmarket.common.cape.dpgd import init_params, parameter_bound, site_gradient, train_dpgd
from dpmarket.common.cape.spec import CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.privacy.noise import SeededNoise

MAX = float(np.finfo(np.float64).max)
CLIP = 1.0


def _crafted(c: float) -> np.ndarray:
    """The stranger's parameters (D = 1, H = 1): ``W1 x + b1`` overflows iff ``x > c``."""
    return np.array([MAX, MAX * (1.0 - c), 1e-310, 0.0])


def test_crafted_parameters_give_a_finite_gradient_with_the_overflowing_record_as_zero() -> None:
    """Rows at -0.9..-0.7 are inactive (``W1 x + b1 < 0``); the last row overflows at 0.9 and
    not at 0.4 (c = 0.5, whose finite but huge activation is clipped). Both tables' gradients
    are finite and the overflowing row counts as 0: the average over four rows is the other
    three's sum over four. Before the fix the table with 0.9 gave NaN (a refusal at the owner)."""
    theta = _crafted(0.5)
    y = np.array([1.0, 0.0, 1.0, 1.0])
    rest = np.array([[-0.9], [-0.8], [-0.7]])
    for last in (0.9, 0.4):
        x = np.vstack([rest, [[last]]])
        with np.errstate(all="raise"):  # no floating-point warning escapes either
            g = site_gradient(theta, x, y, clip=CLIP, hidden=1)
        assert np.isfinite(g).all()
        expected = site_gradient(theta, rest, y[:3], clip=CLIP, hidden=1) * 3 / 4
        np.testing.assert_allclose(g, expected, rtol=0, atol=1e-15)
    assert np.abs(expected[-1]) > 0  # the inactive rows still contribute (to b2)


def _adversarial_thetas(rng: np.random.Generator, count: int) -> list[np.ndarray]:
    """Parameters (D = 2, H = 2: P = 9) mixing the extremes a curator may send."""
    values = np.array([MAX, -MAX, 1e300, -1e300, 1e154, 1e-310, -1e-310, 0.0, 1.0, -2.0])
    return [rng.choice(values, size=9) * rng.uniform(0.5, 1.0, size=9) for _ in range(count)]


def test_the_sensitivity_holds_on_neighbouring_tables_for_adversarial_parameters() -> None:
    """Tables that differ in one record (replaced by each corner of the input box): for every
    parameter vector drawn from the extremes, both gradients are finite, of norm ``<= C``, and
    ``||g - g'|| <= 2 C / N``. Before the fix most of these vectors gave NaN."""
    rng = np.random.default_rng(4)
    n = 6
    x = rng.uniform(-1.0, 1.0, size=(n, 2))
    y = (np.arange(n) % 2).astype(np.float64)
    corners = [np.array(c) for c in itertools.product((-1.0, 1.0), repeat=2)]
    worst = 0.0
    for theta in _adversarial_thetas(rng, 60):
        g = site_gradient(theta, x, y, clip=CLIP, hidden=2)
        assert np.isfinite(g).all() and np.linalg.norm(g) <= CLIP * (1 + 1e-12)
        for corner, label in itertools.product(corners, (0.0, 1.0)):
            x2, y2 = x.copy(), y.copy()
            x2[0], y2[0] = corner, label
            g2 = site_gradient(theta, x2, y2, clip=CLIP, hidden=2)
            assert np.isfinite(g2).all()
            worst = max(worst, float(np.linalg.norm(g - g2)))
    assert worst <= 2 * CLIP / n * (1 + 1e-12)


def test_an_honest_training_stays_within_the_parameter_bound() -> None:
    """CAPE gradient descent (in process, step by step) at a large learning rate and few records
    per site (large noise): every iteration's parameters lie within the bound an owner checks,
    computed from the clip, the learning rate, the iteration and the sites' noise scale."""
    rng = np.random.default_rng(0)
    sites = [(rng.uniform(-1, 1, size=(5, 2)), rng.integers(0, 2, size=5)) for _ in range(3)]
    theta = init_params(2, 3, rng)
    noise = SeededNoise(np.random.default_rng(1))
    lr, iterations = 2.0, 12
    tau = 0.0  # no step taken yet: the bound is the initial parameters'
    for t in range(iterations):
        bound = parameter_bound(clip=CLIP, learning_rate=lr, iteration=t, noise_scale=tau)
        assert np.max(np.abs(theta)) <= bound
        step = train_dpgd(
            sites,
            scheme="cape",
            iterations=1,
            learning_rate=lr,
            clip=CLIP,
            hidden=3,
            rng=rng,
            noise=noise,
            epsilon_total=0.5 / iterations,
            theta0=theta,
        )
        tau = max(step.site_noise)
        theta = step.theta
    assert np.max(np.abs(theta)) <= parameter_bound(
        clip=CLIP, learning_rate=lr, iteration=iterations, noise_scale=tau
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda: CapeMeanSpec((("x", 0.0, 1e300),), 1.0, 1e-6),
        lambda: CapeMeanSpec((("x", -1e101, 0.0),), 1.0, 1e-6),
        lambda: CapeTrainingSpec((("x", 0.0, 1.0),), "y", 1.0, 1e-6, 2, 1.0, 1, 1e200),
        lambda: CapeTrainingSpec((("x", 0.0, 1.0),), "y", 1.0, 1e-6, 2, 1e150, 1, 1.0),
    ],
    ids=["mean-high", "mean-low", "train-clip", "train-learning-rate"],
)
def test_public_numbers_beyond_the_specs_magnitude_are_refused(make: Callable[[], object]) -> None:
    """Bounds, clip and learning rate beyond 1e100: refused when the spec is made (a mean over
    bounds near the largest double could overflow on some records and not on others)."""
    with pytest.raises(ValueError, match=r"within \+-1e\+100"):
        make()


def test_a_mean_and_capefm_on_records_at_the_largest_allowed_bounds_are_finite() -> None:
    """At bounds of +-1e100 (the specs' limit) every record at a bound: the CAPE mean's statistic
    and capeFM's coefficients stay finite. (At bounds of 1e308, which the limit now refuses, the
    mean's sum overflowed when two records lay near the bound and not otherwise.)"""
    from dpmarket.common.cape.capefm import site_coefficients
    from dpmarket.common.cape.mean import site_mean
    from dpmarket.common.cape.spec import CapeJobSpec

    n = 1000
    mean = CapeMeanSpec((("x", -1e100, 1e100),), 1.0, 1e-6)
    values = np.full((n, 1), 1e100)
    assert np.isfinite(site_mean(mean.plan([n, n]), 0, mean.clamped(values).features)).all()
    fm = CapeJobSpec("linear", (("x", -1e100, 1e100),), ("y", -1e100, 1e100), 1.0, 1e-6)
    x, y = fm.scaled(values, np.full(n, -1e100))
    assert np.isfinite(site_coefficients(fm.plan([n, n]), 0, x, y)).all()


def test_no_subnormal_number_is_computed_whatever_the_parameters() -> None:
    """Parameters inside the owner's bound put a row's output logit in [-745, -708], where the
    sigmoid is subnormal (a stranger: the gradient's time then counted such rows, 0.17 -> 0.72 ms
    for 0 -> 169): the terms an owner computes hold 0 or normal numbers only. The control: the
    plain sigmoid of those logits is subnormal."""
    from dpmarket.common.cape.dpgd import per_example_terms

    tiny = np.finfo(np.float64).tiny
    z2 = np.linspace(-745.0, -708.0, 40)
    assert np.any((z2 != 0) & (np.abs(np.exp(-np.logaddexp(0.0, -z2))) < tiny))  # control
    hidden = 1
    x = np.linspace(0.0, 1.0, 40)[:, None]
    # z1 = x + 1 > 0 (so the hidden unit is on); z2 = w2 * z1 + b2 spans the subnormal window.
    w2 = 37.0 / 1.0
    theta = np.array([1.0, 1.0, w2, -745.0 - w2])  # W1, b1, w2, b2 for d = 1, H = 1
    y = np.zeros(40)
    terms = per_example_terms(theta, x, y, hidden)
    for values in terms:
        flat = np.asarray(values, dtype=np.float64).ravel()
        assert np.all((flat == 0) | (np.abs(flat) >= tiny)), flat
