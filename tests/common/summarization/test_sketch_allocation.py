"""The sketch allocation's kernels: sensitivity, budget split, responsibilities, the right owner."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats

from dpmarket.common.privacy.accounting import PrivacyEvent, pld_epsilon
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import Domain, PrivateSketch, SketchMechanism, draw_rff
from dpmarket.common.summarization.calibration import gaussian_epsilon
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features
from dpmarket.common.summarization.sketch_allocation import (
    RELEVANCE_SCORES,
    noisy_relevance,
    relevance_matrix,
    relevance_sensitivity,
    responsibilities,
    sketch_masses,
    split_gaussian_sigmas,
)

D = 4
DOMAIN = Domain(np.full(D, -3.0), np.full(D, 3.0))


def _sketches(
    datasets: list[np.ndarray], seed: int, *, epsilon: float = 1.0, frequencies: int = 200
) -> list[PrivateSketch]:
    fmap = draw_rff(D, frequencies, 0.7, np.random.default_rng(99))
    mech = SketchMechanism(fmap, DOMAIN, epsilon, "gaussian", 1e-6)
    noise = SeededNoise(np.random.default_rng(seed))
    return [mech.release(x, noise) for x in datasets]


def _blobs(rng: np.random.Generator, centres: list[float], n: int) -> list[np.ndarray]:
    return [np.clip(rng.normal(c, 0.3, size=(n, D)), -3, 3) for c in centres]


@pytest.mark.parametrize("score", RELEVANCE_SCORES)
@pytest.mark.parametrize("vote", [True, False])
def test_replacing_one_validation_point_moves_the_decision_by_at_most_the_sensitivity(
    score: str, vote: bool
) -> None:
    rng = np.random.default_rng(1)
    sketches = _sketches(_blobs(rng, [-2.0, 0.0, 2.0], 300), seed=2)
    m = 20
    v = rng.uniform(-3, 3, size=(m, D))
    # Candidates for the replaced point: each owner's centre, corners, random points.
    replacements = np.concatenate(
        [np.full((1, D), c) for c in (-2.0, 0.0, 2.0, -3.0, 3.0)] + [rng.uniform(-3, 3, (20, D))]
    )
    pool = np.concatenate([v, replacements])
    u = relevance_matrix(
        sketches,
        pool,
        score=score,  # type: ignore[arg-type]
        rng=np.random.default_rng(5),
        n_synthetic=2000,
    )
    pi = responsibilities(u, vote=vote)
    base = pi[:m].mean(axis=0)
    worst = 0.0
    for i in range(m):
        for j in range(m, pool.shape[0]):
            moved = base + (pi[j] - pi[i]) / m
            worst = max(worst, float(np.linalg.norm(moved - base)))
    assert worst <= relevance_sensitivity(m) * (1 + 1e-12)
    # The bound is attained when a point's vote moves from one owner to another.
    if vote:
        assert worst == pytest.approx(relevance_sensitivity(m))


def test_responsibilities_are_points_of_the_simplex() -> None:
    u = np.array([[0.0, 0.0, 0.0], [1.0, 3.0, 0.0], [2.0, 2.0, 1.0]])
    assert responsibilities(u).tolist() == [[1 / 3] * 3, [0, 1, 0], [1, 0, 0]]
    assert np.allclose(responsibilities(u, vote=False)[1], [0.25, 0.75, 0])
    with pytest.raises(ValueError, match=">= 0"):
        responsibilities(-u - 1)


def _gaussian_delta(eps: float, mu: float) -> float:
    """Exact delta(eps) of a Gaussian mechanism with privacy-loss scale mu = Delta / sigma."""
    return float(
        stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)
    )


@pytest.mark.parametrize("share", [0.2, 0.5, 0.8])
def test_two_gaussian_releases_compose_to_the_target_exactly(share: float) -> None:
    eps, delta, m = 1.0, 1e-6, 44
    sens = [2 / m, relevance_sensitivity(m)]
    sigmas = split_gaussian_sigmas(eps, delta, sens, [1 - share, share])
    # Independent: the composed loss is Gaussian with mu^2 = sum (Delta_i / sigma_i)^2; its
    # exact delta at eps is the target.
    mu = math.hypot(*(d / s for d, s in zip(sens, sigmas, strict=True)))
    assert _gaussian_delta(eps, mu) == pytest.approx(delta, rel=1e-3)
    achieved = optimize.brentq(lambda e: _gaussian_delta(e, mu) - delta, 1e-3, 10)
    events = [
        PrivacyEvent("gaussian", gaussian_epsilon(s, delta, d), 1, d, scale=s, delta=delta)
        for d, s in zip(sens, sigmas, strict=True)
    ]
    assert pld_epsilon(events, delta) == pytest.approx(achieved, rel=2e-3)
    with pytest.raises(ValueError, match="sum to 1"):
        split_gaussian_sigmas(eps, delta, sens, [0.5, 0.6])


def test_the_owner_holding_the_consumers_kind_of_data_gets_the_largest_relevance() -> None:
    """Three owners of 400 points, the consumer's 60 points come from owner 1's blob. With
    epsilon = 1 sketches and the release at sigma = sqrt(2)/60 * 4.4 / sqrt(0.8) ~ 0.12, owner 1's
    exact mean responsibility is ~1 and the others' ~0, so a wrong argmax needs a noise gap above
    ~1, i.e. > 5.8 standard deviations of the difference of two draws: probability < 1e-8 per
    seed (plus the sketches' noise, ~0.01 of a kernel value here). 5 seeds."""
    rng = np.random.default_rng(7)
    owners = _blobs(rng, [-2.0, 0.0, 2.0], 400)
    validation = np.clip(rng.normal(0.0, 0.3, size=(60, D)), -3, 3)
    sigma = split_gaussian_sigmas(1.0, 1e-6, [1.0, relevance_sensitivity(60)], [0.2, 0.8])[1]
    for seed in range(5):
        sketches = _sketches(owners, seed)
        for score in RELEVANCE_SCORES:
            u = relevance_matrix(
                sketches,
                validation,
                score=score,
                rng=np.random.default_rng(seed),
                n_synthetic=2000,
            )
            exact, noisy = noisy_relevance(
                responsibilities(u), sigma, SeededNoise(np.random.default_rng(seed))
            )
            assert int(np.argmax(noisy)) == 1, (seed, score, exact, noisy)


def test_bad_sketches_are_refused() -> None:
    rng = np.random.default_rng(0)
    sketches = _sketches(_blobs(rng, [0.0], 50), seed=0)
    with pytest.raises(ValueError, match="attributes"):
        relevance_matrix(sketches, np.zeros((3, D + 1)), score="density")
    with pytest.raises(ValueError, match="score"):
        relevance_matrix(sketches, np.zeros((3, D)), score="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rng"):
        relevance_matrix(sketches, np.zeros((3, D)), score="m2m")
    with pytest.raises(ValueError, match="at least one"):
        relevance_matrix([], np.zeros((3, D)), score="density")


def test_the_sketch_masses_match_the_owners_exact_sums_near_the_validation_set() -> None:
    """Three owners of 400 points, the consumer's 60 points from owner 1's blob, sketches at
    epsilon 1,000 (noise negligible), d = 4 (where M2M's uniform design covers the data): the
    masses ``s_k . g`` transferred from the sketches are within 20 % of the exact sums
    ``sum_{x in D_k} g . h1(x)`` on owners holding at least 10 % of the largest, the consumer's
    owner has the largest, and the upper bound adds ``z sigma ||s_k||``. Deterministic (fixed
    seeds); the tolerance is twice the worst error seen on the suite at d <= 7."""
    rng = np.random.default_rng(7)
    owners = _blobs(rng, [-1.0, 0.0, 1.0], 400)
    validation = np.clip(rng.normal(0.0, 0.3, size=(60, D)), -3, 3)
    h1 = draw_rff_params(D, 64, 0.5, np.random.default_rng(3))
    g = random_fourier_features(validation, h1, dtype=np.float64).mean(axis=0)
    exact = np.array(
        [random_fourier_features(x, h1, dtype=np.float64).sum(axis=0) @ g for x in owners]
    )
    sketches = _sketches(owners, 0, epsilon=1000.0)
    upper, mass = sketch_masses(sketches, g, 0.0, h1)
    big = exact >= 0.1 * exact.max()
    np.testing.assert_allclose(mass[big], exact[big], rtol=0.2)
    assert int(np.argmax(mass)) == 1
    np.testing.assert_array_equal(upper, np.maximum(mass, 0.0))
    upper2, mass2 = sketch_masses(sketches, g, 0.01, h1, z=2.0)
    np.testing.assert_array_equal(mass2, mass)
    assert (upper2 > np.maximum(mass, 0.0)).all()
    with pytest.raises(ValueError, match="entries"):
        sketch_masses(sketches, g[:-1], 0.0, h1)
    with pytest.raises(ValueError, match="sigma"):
        sketch_masses(sketches, g, -1.0, h1)
