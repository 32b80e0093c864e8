"""Tests for dpmarket.common.sketches.m2m: the ridge solve, the lambda rules, implicit weights, and
known-accuracy properties of M2M on exact sketches."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import (
    Domain,
    FeatureMap,
    M2MEstimator,
    PrivateSketch,
    SketchMechanism,
    SyntheticDesign,
    draw_race,
    draw_rff,
    histogram_map,
    merge_sketches,
    regularization,
)

UNIT2 = Domain.unit(2)


def _exact(fmap: FeatureMap, x: NDArray[np.float64], domain: Domain = UNIT2) -> PrivateSketch:
    return SketchMechanism(fmap, domain, math.inf, "none").release(x)


def _dense(design: SyntheticDesign) -> NDArray[np.float64]:
    m = design.matrix
    return m if isinstance(m, np.ndarray) else m.toarray()


# ------------------------------------------------------------------ the solve
@pytest.mark.parametrize(
    "fmap",
    [
        draw_rff(2, 6, 1.0, np.random.default_rng(0)),
        histogram_map(UNIT2, 4),
        draw_race(2, 3, 5, 0.2, np.random.default_rng(1)),
    ],
    ids=["rff", "hist", "race"],
)
def test_coefficients_are_the_ridge_closed_form(fmap: FeatureMap) -> None:
    rng = np.random.default_rng(2)
    design = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=500)
    p = _dense(design)
    f = np.column_stack([design.points[:, 0], np.sin(3 * design.points[:, 1])])
    lam = 1e-3
    a, a0 = design.coefficients(f, lam)
    expected = np.linalg.solve(p.T @ p / 500 + lam * np.eye(p.shape[1]), p.T @ f / 500)
    np.testing.assert_allclose(a, expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_array_equal(a0, 0.0)
    # With an intercept: the constant is unpenalized, i.e. centered P and F.
    a, a0 = design.coefficients(f, lam, intercept=True)
    pc, fc = p - p.mean(0), f - f.mean(0)
    expected = np.linalg.solve(pc.T @ pc / 500 + lam * np.eye(p.shape[1]), pc.T @ fc / 500)
    np.testing.assert_allclose(a, expected, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(a0, f.mean(0) - p.mean(0) @ expected, atol=1e-10)


@pytest.mark.parametrize("intercept", [False, True])
def test_implicit_weights_reproduce_every_estimate(intercept: bool) -> None:
    rng = np.random.default_rng(3)
    fmap = draw_rff(2, 8, 1.0, rng)
    x = UNIT2.sample_uniform(300, rng)
    sketch = SketchMechanism(fmap, UNIT2, 2.0).release(x, SeededNoise(rng))
    est = M2MEstimator(sketch, rng=rng, n_synthetic=2000, intercept=intercept)
    f = rng.normal(size=(2000, 5))
    np.testing.assert_allclose(est.weights() @ f, est.estimate_values(f), rtol=1e-9, atol=1e-9)
    assert est.weights().shape == (2000,)


def test_target_moments_are_reused_across_sketches() -> None:
    rng = np.random.default_rng(12)
    fmap = draw_race(2, 4, 6, 0.3, rng)
    design = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=3000)
    f = np.column_stack([design.points[:, 0], design.points.prod(1)])
    tm = design.target_moments(f)
    assert (tm.n_targets, tm.cross.shape) == (2, (24, 2))
    for seed, intercept in ((1, False), (2, True)):
        x = UNIT2.sample_uniform(400, np.random.default_rng(seed))
        est = M2MEstimator(
            SketchMechanism(fmap, UNIT2, 1.0).release(x, SeededNoise(rng)),
            design=design,
            intercept=intercept,
        )
        np.testing.assert_allclose(est.estimate_values(tm), est.estimate_values(f), rtol=1e-12)
        a, a0 = est.coefficients(f)
        np.testing.assert_allclose(est.estimate_values(tm), a0 + est.sketch.mean_embedding @ a)
    assert isinstance(est.estimate_values(design.target_moments(f[:, 0])), float)
    other = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=3000)
    with pytest.raises(ValueError, match="computed on another design"):
        M2MEstimator(est.sketch, design=other).estimate_values(tm)


def test_design_is_shared_and_factors_are_cached() -> None:
    rng = np.random.default_rng(4)
    fmap = histogram_map(UNIT2, 5)
    design = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=1000)
    s1 = _exact(fmap, UNIT2.sample_uniform(50, rng))
    s2 = _exact(fmap, UNIT2.sample_uniform(70, rng))
    e1, e2 = M2MEstimator(s1, design=design), M2MEstimator(s2, design=design)
    assert e1.design is e2.design and e1.lam == e2.lam == 1e-9
    e1.estimate(lambda p: p[:, 0])
    e2.estimate(lambda p: p[:, 1])
    assert len(design._factors) == 1


def test_estimator_refuses_a_design_of_another_map_or_domain() -> None:
    rng = np.random.default_rng(5)
    fmap = draw_rff(2, 4, 1.0, rng)
    sketch = _exact(fmap, UNIT2.sample_uniform(10, rng))
    other = SyntheticDesign.draw(draw_rff(2, 4, 1.0, rng), UNIT2, rng, n_synthetic=100)
    with pytest.raises(ValueError, match="design's feature map differs"):
        M2MEstimator(sketch, design=other)
    wide = SyntheticDesign(fmap, rng.uniform(-1, 2, (100, 2)))
    with pytest.raises(
        ValueError, match=r"synthetic points row \d+, column \d: value .* lies outside"
    ):
        M2MEstimator(sketch, design=wide)
    with pytest.raises(ValueError, match="lies outside"):  # a refusal is not remembered as passed
        M2MEstimator(sketch, design=wide)
    with pytest.raises(ValueError, match="needs a design or an rng"):
        M2MEstimator(sketch)
    with pytest.raises(ValueError, match="prior sample row"):
        M2MEstimator(sketch, rng=rng, n_synthetic=10, prior=lambda n, r: r.uniform(2, 3, (n, 2)))
    est = M2MEstimator(sketch, rng=rng, n_synthetic=50)
    with pytest.raises(ValueError, match=r"shape \(50,\) or \(50, k\)"):
        est.estimate_values(np.ones(49))
    with pytest.raises(ValueError, match="NaN or inf, first at synthetic point 3"):
        est.estimate_values(np.where(np.arange(50) == 3, np.nan, 1.0))


# ------------------------------------------------------------------ lambda rules
def test_lambda_rules_follow_the_noise_level_and_the_count() -> None:
    rng = np.random.default_rng(6)
    fmap = histogram_map(UNIT2, 10)
    sketch = SketchMechanism(fmap, UNIT2, 1.0).release(
        UNIT2.sample_uniform(1000, rng), SeededNoise(rng)
    )
    var = 2 * (2 / 0.98) ** 2  # Laplace b = Delta_1 / eps_num = 2 / 0.98
    n_hat = sketch.count_estimate
    assert sketch.sum_noise_variance == pytest.approx(var)
    assert regularization(sketch, "theorem") == pytest.approx(var / n_hat**2)
    assert regularization(sketch, "paper") == pytest.approx(var / n_hat)
    assert regularization(sketch, 0.25) == 0.25
    assert regularization(sketch, 0.0) == 0.0  # an explicit lambda is not floored
    assert regularization(sketch, "theorem", min_lambda=1.0) == 1.0
    exact = _exact(fmap, UNIT2.sample_uniform(10, rng))
    assert regularization(exact, "theorem") == 1e-9  # the paper's value for exact sketches
    union = merge_sketches([sketch, sketch])
    assert regularization(union, "theorem") == pytest.approx(
        2 * var / (2 * sketch.noisy_count) ** 2
    )
    for bad in ("auto", -1.0, math.nan):
        with pytest.raises(ValueError, match="lambda"):
            regularization(sketch, bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ accuracy on exact sketches
N_S = 20_000


def test_hist_recovers_means_to_the_bin_discretization_error() -> None:
    """Exact HIST sketch: M2M's mean is within half a bin width (w/2) of the truth.

    With the uniform prior, the fitted coefficient of a bin is the synthetic points' mean of
    the attribute in that bin, i.e. the bin's center up to sampling (standard error
    ``w / sqrt(12 * N_S / bins)`` = 0.0065 w here); the data's mean inside a bin is at most w/2
    from the center. Records on the bins' left edges reach the bound; the test allows 0.55 w.
    """
    fmap = histogram_map(UNIT2, 10)
    width = 0.1
    design = SyntheticDesign.draw(fmap, UNIT2, np.random.default_rng(7), n_synthetic=N_S)
    rng = np.random.default_rng(8)
    edges = np.linspace(0.0, 0.9, 10)
    worst = np.column_stack([rng.choice(edges, 2000), rng.choice(edges, 2000)])
    uniform = UNIT2.sample_uniform(2000, rng)
    for x, low in ((worst, 0.45), (uniform, 0.0)):
        est = M2MEstimator(_exact(fmap, x), design=design)
        err = np.abs(est.estimate(lambda p: p) - x.mean(0))
        assert (err <= 0.55 * width).all(), err
        assert (err >= low * width).all(), err  # the edge records do reach ~w/2


def test_rff_recovers_a_smooth_average() -> None:
    rng = np.random.default_rng(9)
    fmap = draw_rff(2, 50, 1.0, rng)
    x = rng.beta(2.0, 5.0, size=(3000, 2))
    est = M2MEstimator(_exact(fmap, x), rng=rng, n_synthetic=N_S)
    truth = np.column_stack([x[:, 0], x[:, 0] * x[:, 1], np.exp(-x[:, 1])]).mean(0)
    got = est.estimate(lambda p: np.column_stack([p[:, 0], p[:, 0] * p[:, 1], np.exp(-p[:, 1])]))
    np.testing.assert_allclose(got, truth, atol=5e-3)


def test_union_estimate_equals_the_pooled_estimate() -> None:
    rng = np.random.default_rng(10)
    fmap = draw_rff(2, 10, 1.0, rng)
    parts = [rng.uniform(0, 1, (n, 2)) for n in (100, 300)]
    design = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=2000)
    union = M2MEstimator(merge_sketches([_exact(fmap, p) for p in parts]), design=design)
    pooled = M2MEstimator(_exact(fmap, np.vstack(parts)), design=design)
    f = design.points[:, 0] ** 2
    assert union.estimate_values(f) == pytest.approx(pooled.estimate_values(f), rel=1e-10)


def test_noisy_estimates_converge_to_the_exact_ones_as_epsilon_grows() -> None:
    rng = np.random.default_rng(11)
    fmap = draw_rff(2, 20, 1.0, rng)
    x = UNIT2.sample_uniform(5000, rng)
    design = SyntheticDesign.draw(fmap, UNIT2, rng, n_synthetic=5000)
    exact = M2MEstimator(_exact(fmap, x), design=design).estimate(lambda p: p)
    errors = []
    for eps in (0.1, 10.0, 1000.0):
        runs = [
            M2MEstimator(
                SketchMechanism(fmap, UNIT2, eps).release(x, SeededNoise(rng)), design=design
            ).estimate(lambda p: p)
            for _ in range(5)
        ]
        errors.append(float(np.mean(np.abs(np.asarray(runs) - exact))))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-3
