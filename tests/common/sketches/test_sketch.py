"""Tests for dpmarket.common.sketches.sketch: sensitivities on neighbouring data, noise scales and
the
budget split, the Gaussian variant, self-consistency checks and unions.

Distribution tests are Kolmogorov-Smirnov tests at threshold ``p > 1e-4`` on seeded draws
(deterministic); each is paired with the same draws rejected against a 2x wrong scale, so the
test can fail.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy import stats

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.accounting import analytic_gaussian_sigma, pld_epsilon
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import (
    DEFAULT_NUMERATOR_SHARE,
    Domain,
    FeatureMap,
    PrivateSketch,
    RFFMap,
    SketchMechanism,
    SketchUnion,
    draw_race,
    draw_rff,
    histogram_map,
    merge_sketches,
    sketch_mmd2,
)

KS_THRESHOLD = 1e-4
D = 3
DOMAIN = Domain(np.array([0.0, 0.0, -2.0]), np.array([1.0, 10.0, 2.0]), names=("u", "v", "w"))


def _maps() -> list[FeatureMap]:
    rng = np.random.default_rng(3)
    return [draw_rff(D, 10, 1.0, rng), draw_race(D, 8, 6, 0.5, rng), histogram_map(DOMAIN, 5)]


MAPS = _maps()
IDS = [m.kind for m in MAPS]


def _data(n: int, seed: int = 0) -> NDArray[np.float64]:
    return DOMAIN.sample_uniform(n, np.random.default_rng(seed))


def _exact(fmap: FeatureMap, x: NDArray[np.float64]) -> PrivateSketch:
    return SketchMechanism(fmap, DOMAIN, math.inf, "none").release(x)


# ------------------------------------------------------------------ sensitivity on neighbours
def _worst_points(fmap: FeatureMap) -> NDArray[np.float64]:
    """Corners of the box, bin edges and random records, plus (for RFF) points found by
    maximizing ``||Phi(x)||_1``."""
    corners = np.array(np.meshgrid(*zip(DOMAIN.low, DOMAIN.high, strict=True))).reshape(D, -1).T
    pts = [corners, _data(300, 9)]
    if fmap.kind == "hist":
        pts.append(np.linspace(DOMAIN.low, DOMAIN.high, 11))  # every bin edge
    if isinstance(fmap, RFFMap):
        cand = _data(20_000, 10)
        l1 = np.abs(fmap.features(cand)).sum(1)
        pts.append(cand[np.argsort(l1)[-20:]])
    return np.vstack(pts)


@pytest.mark.parametrize("fmap", MAPS, ids=IDS)
def test_neighbouring_sums_differ_by_at_most_the_sensitivities(fmap: FeatureMap) -> None:
    """Adding one record changes the released sum (no noise) by at most Delta_1 in L1 and
    Delta_2 in L2, and the count by 1, for worst-case records."""
    base = _data(40, 1)
    s0 = _exact(fmap, base)
    worst_l1 = 0.0
    for x in _worst_points(fmap):
        s1 = _exact(fmap, np.vstack([base, x]))
        diff = s1.noisy_sum - s0.noisy_sum
        worst_l1 = max(worst_l1, float(np.abs(diff).sum()))
        assert np.abs(diff).sum() <= fmap.l1_sensitivity * (1 + 1e-9)
        assert np.linalg.norm(diff) <= fmap.l2_sensitivity * (1 + 1e-9)
        assert s1.noisy_count - s0.noisy_count == 1.0
    if fmap.kind != "rff":
        assert worst_l1 == pytest.approx(fmap.l1_sensitivity)  # attained: the bound is tight
    else:
        assert worst_l1 > 0.9 * fmap.l1_sensitivity


# ------------------------------------------------------------------ noise scales and split
N_RELEASES = 2000


def _noise_draws(
    mech: SketchMechanism, seed: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Noise of ``N_RELEASES`` seeded releases of one data set: sum noise (pooled), count noise."""
    x = _data(7, 2)
    exact = mech.feature_map.feature_sum(x)
    noise = SeededNoise(np.random.default_rng(seed))
    sums, counts = [], []
    for _ in range(N_RELEASES):
        s = mech.release(x, noise)
        sums.append(s.noisy_sum - exact)
        counts.append(s.noisy_count - 7.0)
    return np.concatenate(sums), np.asarray(counts)


def _ks(x: NDArray[np.float64], dist: str, scale: float) -> float:
    return float(stats.kstest(x, dist, args=(0.0, scale)).pvalue)


@pytest.mark.parametrize(
    ("fmap", "epsilon", "share"),
    [(MAPS[0], 1.0, DEFAULT_NUMERATOR_SHARE), (MAPS[2], 0.3, 0.7)],
    ids=["rff-default-split", "hist-0.7-split"],
)
def test_laplace_noise_has_the_configured_scales(
    fmap: FeatureMap, epsilon: float, share: float
) -> None:
    mech = SketchMechanism(fmap, DOMAIN, epsilon, "laplace", numerator_share=share)
    b_sum = fmap.l1_sensitivity / (share * epsilon)
    b_count = 1.0 / ((1.0 - share) * epsilon)
    assert mech.sum_scale == pytest.approx(b_sum, rel=1e-12)
    assert mech.count_scale == pytest.approx(b_count, rel=1e-12)
    assert mech.epsilon_sum + mech.epsilon_count == pytest.approx(epsilon, rel=1e-12)
    assert mech.sum_noise_variance == pytest.approx(2 * b_sum**2)
    xi, zeta = _noise_draws(mech, seed=4)
    assert _ks(xi, "laplace", b_sum) > KS_THRESHOLD
    assert _ks(zeta, "laplace", b_count) > KS_THRESHOLD
    # The same draws against a 2x wrong scale are rejected (the test can fail).
    assert _ks(xi, "laplace", 2 * b_sum) < KS_THRESHOLD
    assert _ks(zeta, "laplace", 2 * b_count) < KS_THRESHOLD
    assert _ks(zeta, "laplace", b_count / 2) < KS_THRESHOLD


def test_default_split_is_the_papers() -> None:
    mech = SketchMechanism(MAPS[1], DOMAIN, 2.0)
    assert (mech.mechanism, mech.numerator_share) == ("laplace", 0.98)
    assert mech.epsilon_sum == pytest.approx(1.96) and mech.epsilon_count == pytest.approx(0.04)
    assert mech.sum_scale == pytest.approx(8 / 1.96) and mech.count_scale == pytest.approx(25.0)


def test_laplace_release_is_charged_as_two_laplace_events_adding_to_epsilon() -> None:
    mech = SketchMechanism(MAPS[0], DOMAIN, 0.5)
    events = mech.privacy_events()
    assert [e.mechanism for e in events] == ["laplace", "laplace"]
    assert sum(e.epsilon for e in events) == pytest.approx(0.5, rel=1e-12)
    assert events[0].sensitivity == MAPS[0].l1_sensitivity
    assert events[0].scale == mech.sum_scale and events[1].scale == mech.count_scale
    assert pld_epsilon(events, 1e-9) <= 0.5 + 1e-6


def test_gaussian_variant_is_calibrated_on_the_l2_sensitivity() -> None:
    fmap = MAPS[0]
    mech = SketchMechanism(fmap, DOMAIN, 1.0, "gaussian", delta=1e-6)
    sigma_u = analytic_gaussian_sigma(1.0, 1e-6, 1.0)
    assert mech.sum_scale is not None and mech.count_scale is not None
    # The whitened pair is the unit-sensitivity Gaussian mechanism with noise sigma_u.
    mu2 = (fmap.l2_sensitivity / mech.sum_scale) ** 2 + (1 / mech.count_scale) ** 2
    assert mu2 == pytest.approx(1 / sigma_u**2, rel=1e-12)
    assert mech.sum_scale == pytest.approx(fmap.l2_sensitivity * sigma_u / math.sqrt(0.98))
    [event] = mech.privacy_events()
    assert (event.mechanism, event.epsilon, event.delta, event.sensitivity) == (
        "gaussian",
        1.0,
        1e-6,
        1.0,
    )
    assert pld_epsilon([event], 1e-6) <= 1.0 + 1e-3
    xi, zeta = _noise_draws(mech, seed=5)
    assert _ks(xi, "norm", mech.sum_scale) > KS_THRESHOLD
    assert _ks(zeta, "norm", mech.count_scale) > KS_THRESHOLD
    assert _ks(xi, "norm", 2 * mech.sum_scale) < KS_THRESHOLD
    assert _ks(zeta, "norm", 2 * mech.count_scale) < KS_THRESHOLD


def test_exact_sketch_has_no_noise_and_costs_nothing_on_paper() -> None:
    x = _data(50)
    mech = SketchMechanism(MAPS[2], DOMAIN, math.inf, "none")
    sketch = mech.release(x, None)
    np.testing.assert_array_equal(sketch.noisy_sum, MAPS[2].feature_sum(x))
    assert sketch.noisy_count == 50.0 and mech.privacy_events() == []
    assert not mech.private and mech.sum_noise_variance == 0.0
    np.testing.assert_allclose(sketch.mean_embedding, MAPS[2].features(x).mean(0))


def test_release_refuses_records_outside_the_domain_naming_row_and_column() -> None:
    x = _data(30)
    x[12, 1] = 10.5
    mech = SketchMechanism(MAPS[0], DOMAIN, 1.0)
    with pytest.raises(InvalidArgumentError, match=r"row 12, v: value 10\.5 lies outside"):
        mech.release(x, SeededNoise(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="needs a noise source"):
        mech.release(_data(3), None)


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"epsilon": 0.0}, "epsilon must be a finite number > 0"),
        ({"epsilon": math.inf}, "use mechanism 'none'"),
        ({"epsilon": 1.0, "mechanism": "none"}, "epsilon = inf"),
        ({"epsilon": 1.0, "mechanism": "exponential"}, "mechanism must be one of"),
        ({"epsilon": 1.0, "delta": 1e-5}, "pure DP: delta must be 0"),
        ({"epsilon": 1.0, "mechanism": "gaussian"}, "needs 0 < delta < 1"),
        ({"epsilon": 1.0, "mechanism": "gaussian", "delta": 1.0}, "needs 0 < delta < 1"),
        ({"epsilon": 1.0, "numerator_share": 1.0}, r"numerator_share must lie in \(0, 1\)"),
        ({"epsilon": 1.0, "sum_scale": 1.0}, "sum_scale = 1.0 does not match"),
        ({"epsilon": 1.0, "count_scale": 49.0}, "count_scale = 49.0 does not match"),
        ({"epsilon": math.inf, "mechanism": "none", "sum_scale": 1.0}, "has sum_scale 0"),
    ],
)
def test_bad_mechanisms_are_refused(kwargs: dict[str, object], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        SketchMechanism(MAPS[0], DOMAIN, **kwargs)  # type: ignore[arg-type]


def test_map_and_domain_must_fit_together() -> None:
    with pytest.raises(ValueError, match="takes 3 attributes but the domain has 2"):
        SketchMechanism(MAPS[0], Domain.unit(2), 1.0)
    narrow = histogram_map(Domain(np.array([0.0, 0.0, -1.0]), np.array([1.0, 10.0, 2.0])), 4)
    with pytest.raises(ValueError, match="HIST map's range must cover the domain"):
        SketchMechanism(narrow, DOMAIN, 1.0)


# ------------------------------------------------------------------ what a consumer checks
def test_received_scales_are_checked_against_the_public_parameters() -> None:
    mech = SketchMechanism(MAPS[0], DOMAIN, 1.0, "gaussian", delta=1e-6)
    again = SketchMechanism(
        MAPS[0],
        DOMAIN,
        1.0,
        "gaussian",
        delta=1e-6,
        sum_scale=mech.sum_scale,
        count_scale=mech.count_scale,
    )
    assert again.sum_scale == mech.sum_scale
    with pytest.raises(ValueError, match="does not match"):
        SketchMechanism(MAPS[0], DOMAIN, 2.0, "gaussian", delta=1e-6, sum_scale=mech.sum_scale)


def test_validate_catches_a_tampered_or_malformed_sketch() -> None:
    sketch = SketchMechanism(MAPS[1], DOMAIN, 1.0).release(
        _data(20), SeededNoise(np.random.default_rng(1))
    )
    sketch.validate()
    with pytest.raises(ValueError, match=r"noisy_sum must have shape \(48,\)"):
        PrivateSketch(sketch.mechanism, sketch.noisy_sum[:-1], sketch.noisy_count)
    with pytest.raises(ValueError, match="NaN or inf"):
        PrivateSketch(sketch.mechanism, np.full(48, np.nan), 3.0)
    # A mechanism whose stated scale was altered after construction fails validation.
    tampered = dataclasses.replace(sketch.mechanism)
    assert sketch.mechanism.sum_scale is not None
    object.__setattr__(tampered, "sum_scale", sketch.mechanism.sum_scale / 2)
    with pytest.raises(ValueError, match="sum_scale"):
        PrivateSketch(tampered, sketch.noisy_sum, sketch.noisy_count)
    # An exact one-hot sketch must add up to its count in every block.
    exact = _exact(MAPS[2], _data(10))
    bad_sum = exact.noisy_sum.copy()
    bad_sum[0] += 1.0
    with pytest.raises(ValueError, match=r"block 0 adds up to 11\.0, not to the count 10\.0"):
        PrivateSketch(exact.mechanism, bad_sum, 10.0)
    with pytest.raises(ValueError, match="whole number >= 1"):
        PrivateSketch(exact.mechanism, exact.noisy_sum, 9.5)


def test_count_estimate_is_floored_at_one() -> None:
    mech = SketchMechanism(MAPS[0], DOMAIN, 1.0)
    sketch = PrivateSketch(mech, np.ones(20), -3.0)
    assert sketch.noisy_count == -3.0 and sketch.count_estimate == 1.0
    np.testing.assert_array_equal(sketch.mean_embedding, np.ones(20))


# ------------------------------------------------------------------ unions
def test_union_of_exact_sketches_is_the_sketch_of_the_pooled_data() -> None:
    fmap = MAPS[1]
    parts = [_data(n, seed) for n, seed in ((30, 1), (50, 2), (5, 3))]
    union = merge_sketches([_exact(fmap, p) for p in parts])
    pooled = _exact(fmap, np.vstack(parts))
    np.testing.assert_allclose(union.noisy_sum, pooled.noisy_sum)
    assert union.noisy_count == 85.0
    np.testing.assert_allclose(union.mean_embedding, pooled.mean_embedding)
    union.validate()


def test_union_adds_noise_variances_and_flattens() -> None:
    fmap = MAPS[0]
    noise = SeededNoise(np.random.default_rng(2))
    a = SketchMechanism(fmap, DOMAIN, 1.0).release(_data(40, 1), noise)
    b = SketchMechanism(fmap, DOMAIN, 0.5, "gaussian", delta=1e-6).release(_data(60, 2), noise)
    c = SketchMechanism(fmap, DOMAIN, 2.0).release(_data(10, 3), noise)
    union = merge_sketches([merge_sketches([a, b]), c])
    assert isinstance(union, SketchUnion) and len(union.parts) == 3
    assert union.sum_noise_variance == pytest.approx(
        a.sum_noise_variance + b.sum_noise_variance + c.sum_noise_variance
    )
    assert union.count_noise_variance == pytest.approx(
        a.count_noise_variance + b.count_noise_variance + c.count_noise_variance
    )
    np.testing.assert_allclose(union.noisy_sum, a.noisy_sum + b.noisy_sum + c.noisy_sum)
    assert union.noisy_count == pytest.approx(a.noisy_count + b.noisy_count + c.noisy_count)


def test_union_refuses_different_maps_or_domains() -> None:
    x = _data(10)
    with pytest.raises(ValueError, match="sketch 1 has a different feature map"):
        merge_sketches([_exact(MAPS[0], x), _exact(_maps()[1], x)])
    other_rff = draw_rff(D, 10, 1.0, np.random.default_rng(99))
    with pytest.raises(ValueError, match="only sketches made with the same public map"):
        merge_sketches([_exact(MAPS[0], x), _exact(other_rff, x)])
    wide = Domain(np.array([0.0, 0.0, -2.0]), np.array([1.0, 10.0, 3.0]), names=("u", "v", "w"))
    s_wide = SketchMechanism(MAPS[0], wide, math.inf, "none").release(x)
    with pytest.raises(ValueError, match="sketch 1 has a different domain"):
        merge_sketches([_exact(MAPS[0], x), s_wide])
    with pytest.raises(ValueError, match="at least one sketch"):
        merge_sketches([])


# ------------------------------------------------------------------ kernel distance
def test_sketch_mmd2_estimates_the_gaussian_kernel_mmd() -> None:
    from dpmarket.common.summarization.kernels import mmd2

    rng = np.random.default_rng(12)
    fmap = draw_rff(D, 2000, 2.0, rng)
    x = _data(400, 1)
    near, far = _data(200, 2), _data(200, 3) * [0.3, 0.2, 0.1]
    exact = _exact(fmap, x)
    gamma = 1 / (2 * 2.0**2)
    for v in (near, far):
        assert sketch_mmd2(exact, v) == pytest.approx(mmd2(x, v, gamma), rel=0.03, abs=2e-3)
    assert sketch_mmd2(exact, near) < sketch_mmd2(exact, far)


def test_sketch_mmd2_debiasing_removes_the_noise_term() -> None:
    fmap = MAPS[1]
    x, v = _data(300, 1), _data(100, 2)
    truth = sketch_mmd2(_exact(fmap, x), v)
    # A small count noise (share 0.5: scale 4 on 300 records) and a large sum noise.
    mech = SketchMechanism(fmap, DOMAIN, 0.5, numerator_share=0.5)
    noise = SeededNoise(np.random.default_rng(13))
    raw, debiased = [], []
    for _ in range(400):
        s = mech.release(x, noise)
        raw.append(sketch_mmd2(s, v, debias=False))
        debiased.append(sketch_mmd2(s, v))
    se = np.std(debiased) / math.sqrt(len(debiased))
    bias = fmap.dimension * mech.sum_noise_variance / (300**2 * fmap.l2_sensitivity**2)
    assert bias > truth  # the noise term dominates the raw value
    assert np.mean(raw) - truth == pytest.approx(bias, rel=0.1)
    # The count's noise is neglected by the correction: allow 5 standard errors plus 3%.
    assert abs(np.mean(debiased) - truth) < 5 * se + 0.03 * truth
    with pytest.raises(ValueError, match="points row 0"):
        sketch_mmd2(s, np.full((1, D), 50.0))
