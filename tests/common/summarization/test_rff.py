"""Tests for dpmarket.common.summarization.rff (h1, Algorithm 1).

Error bounds for ``h1(x) @ h1(y)``: with ``theta_i = (omega_i, b_i)`` i.i.d.,
``h1(x) @ h1(y) = (1/d) sum_i Z_i`` with ``Z_i = 2 cos(omega_i.x + b_i) cos(omega_i.y + b_i)
= cos(omega_i.(x - y)) + cos(omega_i.(x + y) + 2 b_i)``, so ``E Z_i = k(x, y)``,
``Var Z_i = 1 + k**4 / 2 - k**2 <= 1`` (using ``E cos(2 omega.(x - y)) = k(x, y)**4``) and
``|Z_i - k| <= 2 + k <= 3``. Bernstein's inequality then gives, for one pair,
``P(|error| >= t) <= 2 exp(-d t**2 / (2 Var + 2 * 3 t / 3))``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.fourier import (
    ANGLE_LIMIT,
    TINY_ANGLE,
    angle_bound,
    check_angle_bound,
    cos32,
    cos_sin32,
    reduced_angles,
)
from dpmarket.common.summarization.kernels import rbf_kernel
from dpmarket.common.summarization.rff import (
    FeatureScaling,
    RFFParams,
    draw_rff_params,
    kernel_points,
    random_fourier_features,
)


def _bernstein_t(n: int, var: float, b: float, log_term: float) -> float:
    """Smallest ``t`` with ``exp(-n t**2 / (2 var + 2 b t / 3)) <= exp(-log_term)``."""
    a = 2.0 * b * log_term / 3.0
    return (a + math.sqrt(a * a + 8.0 * n * var * log_term)) / (2.0 * n)


def _pair_variance(k: np.ndarray) -> np.ndarray:
    return 1.0 + k**4 / 2.0 - k**2


@pytest.fixture
def points() -> tuple[np.ndarray, np.ndarray, float]:
    rng = np.random.default_rng(12345)
    # Spread chosen so that the exact kernel values cover most of (0, 1].
    x = rng.normal(scale=0.6, size=(20, 3))
    y = rng.normal(scale=0.6, size=(20, 3)) + 0.3
    return x, y, 0.5


def test_draw_params_shapes_and_distribution() -> None:
    params = draw_rff_params(n_features=4, d=5000, gamma=0.3, rng=np.random.default_rng(0))
    assert params.omega.shape == (5000, 4)
    assert params.phase.shape == (5000,)
    assert params.d == 5000 and params.n_features == 4 and params.gamma == 0.3
    # omega ~ N(0, 2 gamma), phase ~ U[0, 2 pi): KS tests, each fails w.p. 1e-4 when correct.
    z = params.omega.ravel() / math.sqrt(2 * 0.3)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    assert stats.kstest(params.phase, stats.uniform(0, 2 * math.pi).cdf).pvalue > 1e-4
    assert (params.phase >= 0).all() and (params.phase < 2 * math.pi).all()


def test_draw_params_deterministic() -> None:
    a = draw_rff_params(3, 10, 0.1, np.random.default_rng(7))
    b = draw_rff_params(3, 10, 0.1, np.random.default_rng(7))
    c = draw_rff_params(3, 10, 0.1, np.random.default_rng(8))
    assert a == b
    assert a != c


def test_params_are_read_only_copies() -> None:
    omega = np.ones((2, 3))
    phase = np.zeros(2)
    params = RFFParams(omega=omega, phase=phase, gamma=1.0)
    omega[0, 0] = 5.0
    assert params.omega[0, 0] == 1.0
    with pytest.raises(ValueError, match="read-only"):
        params.omega[0, 0] = 2.0


@pytest.mark.parametrize(
    ("omega", "phase", "gamma", "match"),
    [
        (np.ones((2, 3)), np.zeros(3), 1.0, "phase must have shape"),
        (np.ones(3), np.zeros(3), 1.0, "2-D"),
        (np.ones((2, 3)), np.zeros((2, 1)), 1.0, "phase must have shape"),
        (np.full((2, 3), np.nan), np.zeros(2), 1.0, "NaN"),
        (np.ones((2, 3)), np.array([0.0, np.inf]), 1.0, "NaN or inf"),
        (np.ones((2, 3)), np.zeros(2), 0.0, "gamma must be"),
        (np.ones((2, 3)), np.zeros(2), -1.0, "gamma must be"),
        (np.ones((2, 3)), np.zeros(2), float("nan"), "gamma must be"),
    ],
)
def test_params_validation(omega, phase, gamma, match) -> None:
    with pytest.raises(ValueError, match=match):
        RFFParams(omega=omega, phase=phase, gamma=gamma)


@pytest.mark.parametrize(
    ("n_features", "d", "gamma", "match"),
    [
        (0, 10, 1.0, "n_features"),
        (3, 0, 1.0, "d must"),
        (3, 2.5, 1.0, "d must"),
        (3, 5, 0, "gamma"),
    ],
)
def test_draw_params_validation(n_features, d, gamma, match) -> None:
    with pytest.raises(ValueError, match=match):
        draw_rff_params(n_features, d, gamma, np.random.default_rng(0))


def test_features_formula_shape_dtype_and_range() -> None:
    rng = np.random.default_rng(1)
    params = draw_rff_params(5, 64, 2.0, rng)
    x = rng.normal(size=(50, 5))
    f = random_fourier_features(x, params)
    assert f.shape == (50, 64) and f.dtype == np.float32
    expected = math.sqrt(2 / 64) * np.cos(x @ params.omega.T + params.phase)
    # float32 cosines (within 4e-6, dpmarket.common.fourier), scaled by sqrt(2/64) ~ 0.18
    np.testing.assert_allclose(f, expected, rtol=0, atol=4e-6 * math.sqrt(2 / 64))
    f64 = random_fourier_features(x, params, dtype=np.float64)
    assert f64.dtype == np.float64
    np.testing.assert_allclose(f64, expected, rtol=0, atol=4e-6 * math.sqrt(2 / 64))
    # The float64 output is the float32 cosine scaled in float64: the float32 output rounds it
    # once more (one unit in the last place, 1.5e-8 at 0.18).
    np.testing.assert_allclose(f64, f.astype(np.float64), rtol=0, atol=1.5e-8)
    bound = math.sqrt(2 / 64)
    assert np.abs(f).max() <= np.float32(bound)
    assert np.abs(f64).max() <= bound


def test_features_empty_input() -> None:
    params = draw_rff_params(3, 8, 1.0, np.random.default_rng(0))
    assert random_fourier_features(np.empty((0, 3)), params).shape == (0, 8)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_features_chunk_size_invariance_bitwise(dtype) -> None:
    rng = np.random.default_rng(2)
    params = draw_rff_params(300, 140, 0.1, rng)
    x = rng.normal(size=(1001, 300))
    ref = random_fourier_features(x, params, dtype=dtype)
    for chunk in (1, 2, 7, 64, 1000, 5000):
        out = random_fourier_features(x, params, dtype=dtype, chunk_size=chunk)
        assert np.array_equal(out, ref), f"chunk_size={chunk} changed the features"
    # One point on its own (the curator re-deriving an acquired point's features).
    assert np.array_equal(random_fourier_features(x[500:501], params, dtype=dtype), ref[500:501])


def test_features_errors() -> None:
    params = draw_rff_params(3, 8, 1.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="3 features"):
        random_fourier_features(np.zeros((4, 2)), params)
    with pytest.raises(ValueError, match="NaN or inf"):
        random_fourier_features(np.array([[0.0, np.nan, 1.0]]), params)
    with pytest.raises(ValueError, match="NaN or inf"):
        random_fourier_features(np.array([[0.0, np.inf, 1.0]]), params)
    with pytest.raises(ValueError, match="2-D"):
        random_fourier_features(np.zeros(3), params)
    with pytest.raises(ValueError, match="chunk_size"):
        random_fourier_features(np.zeros((1, 3)), params, chunk_size=0)
    with pytest.raises(ValueError, match="floating dtype"):
        random_fourier_features(np.zeros((1, 3)), params, dtype=np.int32)


def test_kernel_approximation_d140_mean_abs_error(points) -> None:
    """Mean absolute error over pairs, averaged over R independent h1 draws with d = 140.

    Per pair, ``E|error| <= sqrt(Var/d)``, so one draw's mean absolute error M has
    ``E M <= mu = mean_pairs sqrt(Var_pair / d)``; ``M`` lies in [0, 3] and
    ``Var M <= E M**2 <= E mean_pairs error**2 = mean_pairs Var_pair / d`` (Jensen). Bernstein over
    R i.i.d. draws: the average exceeds ``mu + t`` with probability <= 1e-6.
    """
    x, y, gamma = points
    d, reps = 140, 1000
    k = rbf_kernel(x, y, gamma)
    var = _pair_variance(k)
    mu = float(np.mean(np.sqrt(var / d)))
    t = _bernstein_t(reps, float(var.mean() / d), 3.0, math.log(1e6))
    rng = np.random.default_rng(2024)
    errors = []
    for _ in range(reps):
        params = draw_rff_params(3, d, gamma, rng)
        fx = random_fourier_features(x, params, dtype=np.float64)
        fy = random_fourier_features(y, params, dtype=np.float64)
        errors.append(np.abs(fx @ fy.T - k).mean())
    assert np.mean(errors) <= mu + t  # mu + t ~= 0.11, observed ~0.06; omega off by 2x: ~0.19


def test_kernel_approximation_large_d(points) -> None:
    """scikit-learn-style check at d = 5000: max error <= 0.1, signed mean error small.

    d = 5000 rather than 2000: at d = 2000 the Bernstein bound on the max error (~0.16) does not
    justify scikit-learn's 0.1.

    Max over the 400 pairs: Bernstein per pair (Var <= 1, range 3) with a union bound, failure
    probability <= 1e-6 in total; at d = 5000 the bound is below 0.1 (scikit-learn's threshold).
    Signed mean error over pairs: ``(1/d) sum_i W_i`` with ``W_i = mean_pairs Z_i - mean k``
    i.i.d., ``|W_i| <= 3`` and ``Var W_i = 4 E[A**2 C**2] - (mean k)**2`` where
    ``A = mean_x cos(omega.x + b)``, ``C = mean_y cos(omega.y + b)``; averaging four cosines over
    ``b`` and ``omega`` gives the closed form computed below. Bernstein, failure <= 1e-6.
    """
    x, y, gamma = points
    d = 5000
    k = rbf_kernel(x, y, gamma)
    n_pairs = k.size
    params = draw_rff_params(3, d, gamma, np.random.default_rng(99))
    fx = random_fourier_features(x, params, dtype=np.float64)
    fy = random_fourier_features(y, params, dtype=np.float64)
    err = fx @ fy.T - k

    t_max = _bernstein_t(d, 1.0, 3.0, math.log(2 * n_pairs / 1e-6))
    assert t_max < 0.1
    assert np.abs(err).max() <= t_max

    def kt(v: np.ndarray) -> np.ndarray:  # E_omega cos(omega . v) = exp(-gamma ||v||^2)
        return np.exp(-gamma * np.sum(v * v, axis=-1))

    xp, xq = x[:, None, None, None, :], x[None, :, None, None, :]
    yp, yq = y[None, None, :, None, :], y[None, None, None, :, :]
    e_a2c2 = (kt(xp + xq - yp - yq) + kt(xp - xq + yp - yq) + kt(xp - xq - yp + yq)).mean() / 8
    var_w = 4 * e_a2c2 - k.mean() ** 2
    assert 0 <= var_w <= 1
    t_mean = _bernstein_t(d, var_w, 3.0, math.log(2 / 1e-6))  # ~0.039 here (var_w ~0.22)
    assert abs(err.mean()) <= t_mean


def test_features_are_finite_whatever_the_parameters() -> None:
    # Frequencies a curator crafts so that one value's angle is huge: before angles beyond
    # ANGLE_LIMIT were taken as 0, the float32 cast of their float64 reduction was infinite and
    # the feature NaN for some values only (here 1 and 2 of 0..5, at 3e299).
    x = np.arange(6.0)[:, None]
    for w in (3e299, 1.7e55, 1e30, 1e308):
        params = RFFParams(omega=np.full((4, 1), w), phase=np.array([0.0, 1.0, 3.0, 6.0]), gamma=1)
        f = random_fourier_features(x, params)
        assert np.isfinite(f).all(), w
        # Row 0's angles are the phases; every other row's are beyond the limit: angle 0.
        np.testing.assert_allclose(f[0], math.sqrt(2 / 4) * np.cos(params.phase), atol=1e-6)
        np.testing.assert_array_equal(f[1:], np.full((5, 4), np.float32(math.sqrt(2 / 4))))


def test_angles_within_the_limit_keep_their_accuracy_and_others_are_zero() -> None:
    t = np.array([1e11, -7e11, ANGLE_LIMIT, 2 * ANGLE_LIMIT, np.inf, -np.inf, np.nan, 1e300])
    cos = cos32(t.copy())
    np.testing.assert_allclose(cos[:3], np.cos(t[:3]), atol=2e-4)
    np.testing.assert_array_equal(cos[3:], np.ones(5, dtype=np.float32))
    c, s = cos_sin32(t.copy())
    np.testing.assert_allclose(s[:3], np.sin(t[:3]), atol=2e-4)
    np.testing.assert_array_equal(c[3:], np.ones(5, dtype=np.float32))
    np.testing.assert_array_equal(s[3:], np.zeros(5, dtype=np.float32))


def test_angle_bound_refuses_only_what_can_leave_the_limit() -> None:
    omega = np.array([[1e6, -2e6], [3.0, 0.5]])
    phase = np.array([1.0, -2.0])
    np.testing.assert_allclose(
        angle_bound(omega, phase, np.array([10.0, 100.0])), [1e7 + 2e8 + 1, 30 + 50 + 2]
    )
    check_angle_bound(omega, phase, np.array([1e5, 1e5]), "h1")  # 3e11 + 1: within
    with pytest.raises(ValueError, match=r"h1 row 0 reaches an angle of 3e\+12"):
        check_angle_bound(omega, phase, np.array([1e6, 1e6]), "h1")
    with pytest.raises(ValueError, match="inputs of magnitude 1"):
        check_angle_bound(omega, np.array([0.0, 1e13]), None, "h1")
    with pytest.raises(ValueError, match="row 1"):  # an overflowing bound is refused too
        check_angle_bound(np.array([[0.0], [1e308]]), None, np.array([1e10]), "RFF sketch")


def test_an_angle_is_reduced_alike_whatever_the_other_angles_hold() -> None:
    # The path is not chosen from the angles: an angle of 10 rad is reduced whether or not
    # another angle of its block exceeds 64 rad (the control: rounded directly to float32, 10 is
    # not its reduced value 10 - 4 pi; a path that depended on the block's largest angle gave
    # 10.0 with [10, 1] and -2.5664 with [10, 100], an open's time telling a curator whether
    # some row's value exceeds a threshold).
    small = reduced_angles(np.array([10.0, 1.0]))
    large = reduced_angles(np.array([10.0, 100.0]))
    assert small[0] == large[0] == np.float32(10.0 - 4 * math.pi)
    assert np.float32(10.0) != small[0]


def test_features_take_the_same_operations_for_tables_that_differ_in_one_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # h1 of two tables that differ in one row (its value 0.5 or 50, with frequencies 2: angles
    # 1 and 100 rad): the same numpy operations run, counted on the reduction's rounding.
    params = RFFParams(omega=np.full((3, 1), 2.0), phase=np.zeros(3), gamma=1)
    calls = []
    rint = np.rint

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return rint(*args, **kwargs)

    monkeypatch.setattr(np, "rint", counted)
    counts = []
    rows = []
    for last in (0.5, 50.0):
        calls.clear()
        f = random_fourier_features(np.array([[0.1], [0.2], [last]]), params)
        counts.append(len(calls))
        rows.append(f[:2])
    assert counts[0] == counts[1] >= 1
    np.testing.assert_array_equal(rows[0], rows[1])  # the other rows' features, bit for bit


def test_tiny_angles_are_zero_and_no_float32_angle_is_subnormal() -> None:
    tiny32 = np.finfo(np.float32).tiny
    t = np.array([1e-40, -1e-310, 5e-324, 3e-35, TINY_ANGLE, 1.0])
    # The control: cast directly, these angles are float32 subnormals (or float64 ones).
    direct = t.astype(np.float32)
    assert ((direct != 0) & (np.abs(direct) < tiny32)).any()
    out = reduced_angles(t.copy())
    assert not ((out != 0) & (np.abs(out) < tiny32)).any()
    np.testing.assert_array_equal(out[:4], np.zeros(4, dtype=np.float32))
    assert out[4] == np.float32(TINY_ANGLE) and out[5] == np.float32(1.0)


def test_features_under_a_scaling_are_those_of_the_points_scaled_bit_for_bit() -> None:
    """h1 under a feature scaling is h1 without one of ``(x - low) / (high - low)``, bit for bit
    and whatever the chunking; the draw is the same with or without the scaling; unit bounds
    leave every value as it is, so their features are those without a scaling. Control: main's
    parameters carry no scaling (the draw's ``scaling`` keyword is a TypeError there)."""
    rng = np.random.default_rng(5)
    low, high = np.array([0.0, -3e4, 40.0]), np.array([1e5, 7e4, 41.0])
    x = rng.uniform(low, high, (300, 3))
    scaling = FeatureScaling(low=low, high=high)
    plain = draw_rff_params(3, 32, 0.7, np.random.default_rng(1))
    scaled = draw_rff_params(3, 32, 0.7, np.random.default_rng(1), scaling=scaling)
    np.testing.assert_array_equal(plain.omega, scaled.omega)
    np.testing.assert_array_equal(plain.phase, scaled.phase)
    assert plain != scaled
    z = (x - low) / (high - low)
    assert (z >= 0).all() and (z <= 1).all()
    np.testing.assert_array_equal(scaling.apply(x), z)
    np.testing.assert_array_equal(kernel_points(x, scaling), z)
    assert kernel_points(x, None) is x
    expected = random_fourier_features(z, plain)
    np.testing.assert_array_equal(random_fourier_features(x, scaled), expected)
    np.testing.assert_array_equal(random_fourier_features(x, scaled, chunk_size=7), expected)
    unit = FeatureScaling(low=np.zeros(3), high=np.ones(3))
    u = rng.uniform(0.0, 1.0, (50, 3))
    np.testing.assert_array_equal(unit.apply(u), u)
    unit_params = RFFParams(plain.omega, plain.phase, plain.gamma, scaling=unit)
    np.testing.assert_array_equal(
        random_fourier_features(u, unit_params), random_fourier_features(u, plain)
    )


@pytest.mark.parametrize(
    ("low", "high", "match"),
    [
        ([0.0, 1.0], [1.0, 1.0], "low < high"),
        ([0.0], [np.inf], "finite"),
        ([-1e308], [1e308], "finite high - low"),
        ([0.0, 0.0], [1.0], "one length"),
        ([], [], "one length"),
    ],
)
def test_a_feature_scaling_refuses_bounds_it_cannot_scale_by(low, high, match) -> None:
    with pytest.raises(ValueError, match=match):
        FeatureScaling(low=np.array(low), high=np.array(high))


def test_params_refuse_a_scaling_of_another_feature_count() -> None:
    params = draw_rff_params(3, 4, 1.0, np.random.default_rng(0))
    two = FeatureScaling.of_bounds([[0.0, 1.0], [0.0, 2.0]])
    with pytest.raises(ValueError, match="FeatureScaling of 3 features"):
        RFFParams(params.omega, params.phase, 1.0, scaling=two)
    with pytest.raises(ValueError, match="shape"):
        FeatureScaling.of_bounds([0.0, 1.0])
