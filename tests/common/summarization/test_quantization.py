"""Tests for dpmarket.common.summarization.quantization (summarization paper, Appendix B)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.summarization.quantization import (
    quantization_grid,
    quantize_features,
    stochastic_quantize,
)


@pytest.mark.parametrize(("eta", "n_points"), [(1.0, 3), (0.5, 5), (0.25, 9), (2 / 7, 8)])
def test_grid_spans_minus_one_to_one_with_step_eta(eta: float, n_points: int) -> None:
    grid = quantization_grid(eta)
    assert grid.shape == (n_points,)
    assert grid.dtype == np.float64
    assert grid[0] == -1.0
    assert grid[-1] == 1.0
    np.testing.assert_allclose(np.diff(grid), eta, rtol=1e-12)
    np.testing.assert_allclose(grid, -grid[::-1], atol=1e-15)


def test_grid_accepts_eta_within_tolerance() -> None:
    assert quantization_grid(0.1 + 1e-12).shape == (21,)


@pytest.mark.parametrize("eta", [0.0, -0.5, 1.5, 0.3, 0.7, math.nan, math.inf, "x"])
def test_grid_rejects_bad_eta(eta: object) -> None:
    with pytest.raises(ValueError, match="eta"):
        quantization_grid(eta)  # type: ignore[arg-type]


def test_values_lie_on_grid_and_within_eta() -> None:
    rng = np.random.default_rng(0)
    eta = 0.25
    x = rng.uniform(-1, 1, size=(200, 30))
    x[0, :5] = [-1.0, 1.0, 0.0, 0.25, -0.75]  # grid points are returned unchanged
    qx = stochastic_quantize(x, eta, rng)
    assert qx.shape == x.shape
    assert qx.dtype == np.float64
    assert np.isin(qx, quantization_grid(eta)).all()
    assert (np.abs(qx - x) < eta).all()
    np.testing.assert_array_equal(qx[0, :5], x[0, :5])


def test_rounds_to_one_of_the_two_neighbours() -> None:
    rng = np.random.default_rng(1)
    x = np.full(10_000, 0.3)
    qx = stochastic_quantize(x, 0.5, rng)
    assert set(np.unique(qx)) == {0.0, 0.5}


def test_unbiased_within_clt_bound() -> None:
    # For each x, the mean of n draws of Q(x) has standard deviation
    # sqrt(p (1 - p)) eta / sqrt(n) <= eta / (2 sqrt(n)). With 40 values and a 5-sigma bound,
    # a Bonferroni bound puts the failure probability below 40 * 5.7e-7 < 3e-5.
    rng = np.random.default_rng(2)
    eta = 0.5
    n = 20_000
    x = np.concatenate([rng.uniform(-1, 1, 37), [-1.0, 0.999, 1.0]])
    draws = stochastic_quantize(np.broadcast_to(x, (n, x.size)), eta, rng)
    sd_bound = eta / (2 * math.sqrt(n))
    assert np.abs(draws.mean(axis=0) - x).max() <= 5 * sd_bound


def test_up_probability_matches_appendix_b() -> None:
    # P[Q(x) = -1 + (k + 1) eta] = (x + 1 - k eta) / eta; binomial 5-sigma bound per value.
    rng = np.random.default_rng(3)
    eta = 0.25
    n = 20_000
    for x in (-0.9, -0.1, 0.6):
        k = math.floor((x + 1) / eta)
        p_up = (x + 1 - k * eta) / eta
        draws = stochastic_quantize(np.full(n, x), eta, rng)
        ups = int(np.sum(np.isclose(draws, -1 + (k + 1) * eta)))
        result = stats.binomtest(ups, n, p_up)
        assert result.pvalue > 1e-4


def test_tiny_excess_is_clipped() -> None:
    rng = np.random.default_rng(4)
    qx = stochastic_quantize(np.array([1 + 1e-13, -1 - 1e-13]), 0.5, rng)
    np.testing.assert_array_equal(qx, [1.0, -1.0])


@pytest.mark.parametrize(
    ("values", "match"),
    [
        (np.array([0.0, 1.5]), "1.5"),
        (np.array([-1.0 - 1e-9]), "outside"),
        (np.array([0.0, np.nan]), "NaN"),
        (np.array([np.inf]), "NaN or inf"),
        (np.array(["a"]), "real"),
    ],
)
def test_quantize_rejects_bad_values(values: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        stochastic_quantize(values, 0.5, np.random.default_rng(0))


def test_quantize_rejects_bad_eta() -> None:
    with pytest.raises(ValueError, match="eta"):
        stochastic_quantize(np.zeros(3), 0.3, np.random.default_rng(0))


def test_same_seed_same_result() -> None:
    x = np.linspace(-1, 1, 101)
    a = stochastic_quantize(x, 0.1, np.random.default_rng(5))
    b = stochastic_quantize(x, 0.1, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)


def test_quantize_features_scales_by_sqrt_half_d() -> None:
    rng = np.random.default_rng(6)
    d = 8
    feats = math.sqrt(2 / d) * rng.uniform(-1, 1, size=(500, d))
    qf = quantize_features(feats, 0.5, rng)
    assert qf.shape == (500, d)
    assert np.isin(qf, quantization_grid(0.5)).all()
    assert (np.abs(qf - math.sqrt(d / 2) * feats) < 0.5).all()
    # Extreme features map to the grid's end points deterministically.
    ends = quantize_features(np.array([[math.sqrt(2 / d)] * d, [-math.sqrt(2 / d)] * d]), 0.5, rng)
    np.testing.assert_array_equal(ends, [[1.0] * d, [-1.0] * d])


def test_quantize_features_tolerates_float32_rounding() -> None:
    d = 140
    # float32 h1 feature at its maximum, with the float32 rounding of sqrt(2/d) * 1.0.
    feats = np.full((2, d), np.float32(math.sqrt(2 / d)) * np.float32(1.0000001), dtype=np.float32)
    qf = quantize_features(feats, 0.5, np.random.default_rng(7))
    np.testing.assert_array_equal(qf, 1.0)


def test_quantize_features_rejects_out_of_range_and_bad_shapes() -> None:
    rng = np.random.default_rng(8)
    d = 4
    with pytest.raises(ValueError, match="sqrt"):
        quantize_features(np.full((3, d), 0.8), 0.5, rng)  # sqrt(2/4) = 0.707 < 0.8
    with pytest.raises(ValueError, match="2-D"):
        quantize_features(np.zeros(d), 0.5, rng)
    with pytest.raises(ValueError, match="NaN"):
        quantize_features(np.array([[0.0, np.nan]]), 0.5, rng)
    with pytest.raises(ValueError, match="empty"):
        quantize_features(np.zeros((0, d)), 0.5, rng)
