"""Tests for dpmarket.common.sketches.feature_maps: values, sizes, sensitivities, parameters as
data."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.optimize import minimize

from dpmarket.common.sketches import (
    Domain,
    FeatureMap,
    HISTMap,
    RACEMap,
    RFFMap,
    draw_race,
    draw_rff,
    feature_map_from_parameters,
    histogram_map,
)

D = 3
DOMAIN = Domain(np.array([-1.0, 0.0, 2.0]), np.array([1.0, 4.0, 3.0]))


def _maps() -> list[FeatureMap]:
    rng = np.random.default_rng(7)
    return [
        draw_rff(D, 16, 0.5, rng),
        draw_race(D, 12, 5, 0.3, rng),
        histogram_map(DOMAIN, [4, 7, 3]),
    ]


MAPS = _maps()
IDS = [m.kind for m in MAPS]


def test_rff_features_are_cos_and_sin_of_the_projections() -> None:
    fmap = MAPS[0]
    assert isinstance(fmap, RFFMap)
    x = DOMAIN.sample_uniform(50, np.random.default_rng(0))
    t = x @ fmap.omega.T
    # float32 cosines and sines: within the 4e-6 dpmarket.common.fourier documents.
    np.testing.assert_allclose(fmap.features(x), np.hstack([np.cos(t), np.sin(t)]), atol=4e-6)
    assert (fmap.dimension, fmap.n_frequencies) == (32, 16)
    assert fmap.l1_sensitivity == pytest.approx(16 * math.sqrt(2))
    assert fmap.l2_sensitivity == pytest.approx(4.0)


def test_rff_rows_never_exceed_the_declared_norms() -> None:
    # In float32, cos^2 + sin^2 exceeds 1 for about half of all angles, so unscaled rows would
    # exceed Delta_2 = sqrt(m'); the per-row scaling keeps every row within both sensitivities.
    fmap = draw_rff(D, 16, 0.5, np.random.default_rng(11))
    x = np.random.default_rng(12).normal(0.0, 20.0, size=(20_000, D))
    t = (x @ fmap.omega.T).astype(np.float32)
    unscaled = np.cos(t).astype(np.float64) ** 2 + np.sin(t).astype(np.float64) ** 2
    assert (unscaled.sum(axis=1) > fmap.n_frequencies).any()
    features = fmap.features(x)
    assert np.sqrt((features**2).sum(axis=1)).max() <= fmap.l2_sensitivity
    assert np.abs(features).sum(axis=1).max() <= fmap.l1_sensitivity
    np.testing.assert_allclose(features.sum(axis=0), fmap.feature_sum(x), atol=1e-8)


def test_draw_rff_frequencies_have_the_kernel_scale() -> None:
    fmap = draw_rff(4, 20_000, 0.25, np.random.default_rng(3))
    # omega ~ N(0, sigma^-2): std 4; the sample std of 80,000 draws is within 1% (6 s.e.).
    assert fmap.omega.std() == pytest.approx(4.0, rel=0.01)
    # Bochner: mean_j cos(omega_j . delta) estimates exp(-|delta|^2 / (2 sigma^2)).
    delta = np.array([0.1, -0.2, 0.05, 0.0])
    kernel = float(np.mean(np.cos(fmap.omega @ delta)))
    assert kernel == pytest.approx(math.exp(-(delta @ delta) / (2 * 0.25**2)), abs=0.02)


def test_race_buckets_follow_the_p_stable_hash() -> None:
    fmap = MAPS[1]
    assert isinstance(fmap, RACEMap)
    x = DOMAIN.sample_uniform(200, np.random.default_rng(1))
    codes = np.floor((x @ fmap.projections.T + fmap.offsets) / fmap.bucket_width)
    expected = np.mod(codes, fmap.n_buckets).astype(int) + np.arange(12) * 5
    np.testing.assert_array_equal(fmap.bucket_indices(x), expected)
    assert (fmap.dimension, fmap.l1_sensitivity, fmap.l2_sensitivity) == (60, 12.0, math.sqrt(12))


def test_race_nearby_points_collide_more_often_than_far_ones() -> None:
    """The LSH property: collision frequency decreases with distance (Datar et al.)."""
    fmap = draw_race(2, 4000, 1000, 0.5, np.random.default_rng(5))
    origin = np.zeros((1, 2))
    rates = []
    for dist in (0.05, 0.3, 1.5):
        b0 = fmap.bucket_indices(origin)
        b1 = fmap.bucket_indices(np.array([[dist, 0.0]]))
        rates.append(float(np.mean(b0 == b1)))
    assert rates[0] > rates[1] > rates[2]
    assert rates[0] > 0.9 and rates[2] < 0.5


def test_hist_bins_are_equal_width_and_close_at_the_top() -> None:
    fmap = MAPS[2]
    assert isinstance(fmap, HISTMap)
    x = np.array([[-1.0, 0.0, 2.0], [1.0, 4.0, 3.0], [-0.5, 0.5714286, 2.34]])
    # attribute 0: 4 bins of 0.5; attribute 1: 7 bins of 4/7; attribute 2: 3 bins of 1/3
    np.testing.assert_array_equal(fmap.bucket_indices(x), [[0, 4, 11], [3, 10, 13], [1, 5, 12]])
    np.testing.assert_allclose(fmap.bin_widths(), [0.5, 4 / 7, 1 / 3])
    np.testing.assert_allclose(fmap.bin_edges(0), [-1.0, -0.5, 0.0, 0.5, 1.0])
    assert (fmap.dimension, fmap.l1_sensitivity, fmap.l2_sensitivity) == (14, 3.0, math.sqrt(3))


def test_hist_refuses_a_value_outside_its_range_naming_row_and_column() -> None:
    x = DOMAIN.sample_uniform(20_000, np.random.default_rng(0))
    x[17_000, 2] = 3.5
    with pytest.raises(ValueError, match=r"x row 17000, column 2: value 3\.5 lies outside"):
        MAPS[2].feature_sum(x, chunk_size=1000)


@pytest.mark.parametrize("fmap", MAPS, ids=IDS)
def test_features_sums_and_design_agree_whatever_the_chunking(fmap: FeatureMap) -> None:
    x = DOMAIN.sample_uniform(1001, np.random.default_rng(2))
    full = fmap.features(x)
    assert full.shape == (1001, fmap.dimension) and full.dtype == np.float64
    np.testing.assert_allclose(fmap.features(x, chunk_size=7), full, atol=1e-12)
    np.testing.assert_allclose(fmap.feature_sum(x, chunk_size=64), full.sum(0), atol=1e-9)
    design = fmap.design_matrix(x, chunk_size=100)
    dense = design if isinstance(design, np.ndarray) else design.toarray()
    np.testing.assert_allclose(dense, full, atol=1e-12)
    assert fmap.features(np.zeros((0, D))).shape == (0, fmap.dimension)
    np.testing.assert_array_equal(fmap.feature_sum(np.zeros((0, D))), 0.0)


@pytest.mark.parametrize("fmap", MAPS, ids=IDS)
def test_parameters_travel_as_data(fmap: FeatureMap) -> None:
    params = fmap.parameters()
    rebuilt = feature_map_from_parameters(fmap.kind, {k: np.array(v) for k, v in params.items()})
    assert rebuilt == fmap
    x = DOMAIN.sample_uniform(30, np.random.default_rng(4))
    np.testing.assert_array_equal(rebuilt.features(x), fmap.features(x))
    for value in params.values():
        if isinstance(value, np.ndarray):
            assert not value.flags.writeable
    copy = feature_map_from_parameters(fmap.kind, {k: np.array(v) for k, v in params.items()})
    assert copy == fmap and copy is not fmap
    assert fmap != MAPS[(MAPS.index(fmap) + 1) % len(MAPS)]


def test_feature_map_from_parameters_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown feature map kind 'kde'"):
        feature_map_from_parameters("kde", {})
    with pytest.raises(ValueError, match=r"missing \['sigma'\]"):
        feature_map_from_parameters("rff", {"omega": np.ones((2, 2))})
    with pytest.raises(ValueError, match=r"unexpected \['seed'\]"):
        feature_map_from_parameters("rff", {"omega": np.ones((2, 2)), "sigma": 1.0, "seed": 3})


@pytest.mark.parametrize(
    ("build", "pattern"),
    [
        (lambda: RFFMap(np.ones((2, 3)), 0.0), "RFF sigma must be a finite number > 0"),
        (lambda: RFFMap(np.array([[np.nan, 1.0]]), 1.0), "NaN or inf"),
        (lambda: RFFMap(np.ones(3), 1.0), "2-D"),
        (lambda: RACEMap(np.ones((2, 3)), np.array([0.0, 0.5]), 0.5, 4), r"offsets\[1\] = 0\.5"),
        (lambda: RACEMap(np.ones((2, 3)), np.array([0.0]), 0.5, 4), r"shape \(2,\)"),
        (lambda: RACEMap(np.ones((2, 3)), np.array([0.0, 0.1]), -1.0, 4), "bucket_width"),
        (
            lambda: RACEMap(np.ones((2, 3)), np.array([0.0, 0.1]), 0.5, 0),
            "n_buckets must be an integer",
        ),
        (
            lambda: HISTMap(np.array([0.0, 0.0]), np.array([1.0, 1.0]), np.array([3, 0])),
            "n_bins must be an integer >= 1",
        ),
        (
            lambda: HISTMap(np.array([0.0, 1.0]), np.array([1.0, 1.0]), np.array([3, 3])),
            "low < high",
        ),
        (
            lambda: HISTMap(np.array([0.0, 0.0]), np.array([1.0, 1.0]), np.array([3, 3, 3])),
            r"shape \(2,\)",
        ),
        (lambda: draw_rff(3, 0, 1.0, np.random.default_rng(0)), "n_frequencies"),
        (lambda: draw_race(3, 4, 4, math.inf, np.random.default_rng(0)), "bucket_width"),
    ],
)
def test_bad_parameters_are_refused(build: object, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("fmap", MAPS, ids=IDS)
def test_features_refuse_bad_points(fmap: FeatureMap) -> None:
    with pytest.raises(ValueError, match="3 features per point"):
        fmap.features(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="NaN or inf"):
        fmap.features(np.array([[0.0, math.nan, 2.5]]))


# --------------------------------------------------------------------------- sensitivities
_POINTS = arrays(
    np.float64,
    (D,),
    elements=st.floats(0.0, 1.0, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=200, deadline=None)
@given(u=_POINTS)
def test_no_record_exceeds_the_stated_sensitivities(u: np.ndarray) -> None:
    """``||Phi(x)||_1 <= Delta_1`` and ``||Phi(x)||_2 <= Delta_2`` anywhere in the domain."""
    x = (DOMAIN.low + u * DOMAIN.width())[None, :]
    for fmap in MAPS:
        phi = fmap.features(x)[0]
        assert np.abs(phi).sum() <= fmap.l1_sensitivity
        assert np.linalg.norm(phi) <= fmap.l2_sensitivity
        if fmap.kind != "rff":  # one-hot maps attain both bounds at every record
            assert np.abs(phi).sum() == fmap.l1_sensitivity
        else:  # ||Phi(x)||_2 = sqrt(m') up to the float32 values and the scaling's margin
            assert np.linalg.norm(phi) == pytest.approx(fmap.l2_sensitivity, rel=1e-6)


def test_rff_l1_bound_holds_at_adversarially_searched_points() -> None:
    """Maximize ``||Phi(x)||_1`` over the box from many starts: never above ``m' sqrt 2``."""
    fmap = MAPS[0]
    rng = np.random.default_rng(11)
    bounds = list(zip(DOMAIN.low, DOMAIN.high, strict=True))
    best = 0.0
    for start in DOMAIN.sample_uniform(40, rng):
        res = minimize(
            lambda x: -np.abs(fmap.features(x[None, :])[0]).sum(),
            start,
            method="L-BFGS-B",
            bounds=bounds,
        )
        best = max(best, -float(res.fun))
    assert best <= fmap.l1_sensitivity
    assert best > 0.8 * fmap.l1_sensitivity  # the search does find large values


def test_rff_l1_bound_is_attained() -> None:
    """With every frequency on one axis the record ``x = pi / 4`` reaches ``m' sqrt 2``: a
    smaller stated sensitivity would fail the checks above."""
    omega = np.zeros((5, 2))
    omega[:, 0] = 1.0
    fmap = RFFMap(omega, 1.0)
    phi = fmap.features(np.array([[math.pi / 4, 0.3]]))[0]
    assert np.abs(phi).sum() == pytest.approx(fmap.l1_sensitivity, rel=1e-6)  # float32 values


def test_maps_are_total_whatever_the_curators_parameters() -> None:
    # Frequencies and projections far beyond any draw for the data's scale: an angle or a code
    # that would be NaN or infinite for some records only is 0 for every one (RFF: cos 1, sin 0,
    # the row's norms kept), and every RACE bucket stays in range. Before, the RFF features
    # were NaN at 3e299 for x = 1 or 2 only, and RACE's codes overflowed to a garbage index.
    x = np.array([[0.0], [1.0], [2.0], [5.0]])
    rff = RFFMap(np.array([[3e299], [1.0]]), 1.0).features(x)
    assert np.isfinite(rff).all()
    np.testing.assert_allclose(rff[1:, 0], 1.0)  # cos of the angle taken as 0
    np.testing.assert_allclose(rff[:, 1], np.cos(x[:, 0]), atol=1e-6)
    race = RACEMap(np.array([[1e308], [1.0]]), np.array([0.0, 0.1]), 0.5, 4)
    feats = race.features(np.array([[0.0], [1e10], [-1e10], [5.0]]))
    assert feats.shape == (4, 8) and np.isfinite(feats).all()
    np.testing.assert_array_equal(feats.sum(axis=1), 2.0)  # one bucket per hash, in range
