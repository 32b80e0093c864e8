"""The candidates method's kernels: sensitivity, threshold, budget allocation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmarket.common.summarization.candidates import (
    allocate_candidates,
    mass_read_caps,
    relevance_threshold,
    shrink_embedding,
    shrink_in_score_metric,
    shrink_towards_points,
    shrinkage_strength,
    size_read_caps,
    validation_embedding,
    validation_embedding_in_chunks,
    validation_embedding_sensitivity,
)
from dpmarket.common.summarization.methods import SHRINKAGE_STRENGTHS
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features


@pytest.mark.parametrize("chunk_rows", [1, 7, 1000, 5000])
def test_the_embedding_made_in_chunks_is_the_embedding_of_the_whole_features(
    chunk_rows: int,
) -> None:
    """The curator's chunked validation embedding (never the m x d features at once) equals the
    mean of the whole feature matrix's unit-norm rows, whatever the chunk, to rounding."""
    rng = np.random.default_rng(4)
    points = rng.normal(size=(2_345, 6))
    rff = draw_rff_params(6, 64, 0.2, rng)
    whole = validation_embedding(random_fourier_features(points, rff, dtype=np.float64))
    chunked = validation_embedding_in_chunks(points, rff, chunk_rows=chunk_rows)
    assert chunked.shape == whole.shape
    np.testing.assert_allclose(chunked, whole, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="chunk_rows"):
        validation_embedding_in_chunks(points, rff, chunk_rows=0)


def test_sensitivity_bounds_the_change_of_the_mean_embedding() -> None:
    """Replacing one of m points moves the unit-norm mean embedding by at most 2 / m, and
    nearly that much for an adversarial pair."""
    rng = np.random.default_rng(0)
    rff = draw_rff_params(3, 64, 0.5, rng)
    m = 10
    base = rng.normal(size=(m, 3))
    worst = 0.0
    for _ in range(2000):
        other = base.copy()
        other[0] = rng.normal(scale=10, size=3)
        a = random_fourier_features(base, rff, dtype=np.float64)
        b = random_fourier_features(other, rff, dtype=np.float64)
        worst = max(worst, float(np.linalg.norm(validation_embedding(a) - validation_embedding(b))))
    bound = validation_embedding_sensitivity(m)
    assert worst <= bound
    assert worst >= 0.5 * bound
    with pytest.raises(ValueError, match="m must be"):
        validation_embedding_sensitivity(0)


def test_threshold_removes_the_noise_energy() -> None:
    rng = np.random.default_rng(1)
    g = rng.normal(scale=0.05, size=200)
    sigma = 0.1
    noisy = g + rng.normal(scale=sigma, size=200)
    debiased = relevance_threshold(noisy, 1.0, noise_sigma=sigma)
    # ||noise||^2 - d sigma^2 has standard deviation sigma^2 sqrt(2d) = 0.2; 6 sd: p < 1e-8.
    assert abs(debiased - g @ g) <= 6 * sigma**2 * np.sqrt(2 * 200) + 2 * abs(g @ (noisy - g))
    assert relevance_threshold(noisy, 0.5) == pytest.approx(0.5 * noisy @ noisy)
    assert relevance_threshold(np.zeros(4), 1.0, noise_sigma=1.0) == 0.0
    with pytest.raises(ValueError, match="noise_sigma"):
        relevance_threshold(g, 1.0, noise_sigma=-1.0)


def test_allocation_is_proportional_after_the_even_share() -> None:
    shares = allocate_candidates(100, [3.0, 1.0, 0.0, 0.0], [100] * 4, even_share=0.2)
    # 20 split evenly (5 each), 80 split 3:1.
    np.testing.assert_array_equal(shares, [65, 25, 5, 5])


def test_allocation_redistributes_what_a_capped_owner_cannot_take() -> None:
    shares = allocate_candidates(100, [10.0, 1.0], [20, 200], even_share=0.0)
    np.testing.assert_array_equal(shares, [20, 80])


def test_allocation_without_signal_is_even() -> None:
    np.testing.assert_array_equal(
        allocate_candidates(10, [0.0, 0.0, 0.0], [10, 10, 10], even_share=0.0), [4, 3, 3]
    )


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 500),
    weights=st.lists(st.floats(0, 1e4), min_size=1, max_size=12),
    data=st.data(),
    even=st.floats(0, 1),
)
def test_allocation_respects_budget_and_caps(budget, weights, data, even) -> None:
    caps = data.draw(st.lists(st.integers(0, 100), min_size=len(weights), max_size=len(weights)))
    shares = allocate_candidates(budget, weights, caps, even_share=even)
    assert shares.sum() == min(budget, sum(caps))
    assert (shares >= 0).all() and (shares <= np.asarray(caps)).all()


def test_the_size_cap_moves_a_small_owners_excess_to_the_others() -> None:
    """tv16-40's pattern in small: the decision votes 90 % for an owner of 236 points, 300 reads.

    Control (old code, no size cap): the small owner gets 270 of its 236-point capacity capped at
    236, i.e. its whole table. With c = 4 it gets ceil(236 / 4) = 59 and the other 241 reads go
    to the others in proportion to their weights (water-filling), the budget conserved."""
    sizes, weights = [236, 1000, 2000], [0.9, 0.06, 0.04]
    old = allocate_candidates(300, weights, [236, 300, 300], even_share=0.0)
    np.testing.assert_array_equal(old, [236, 38, 26])
    capped = size_read_caps([236, 300, 300], sizes, 4.0, 300)
    np.testing.assert_array_equal(capped, [59, 250, 300])
    shares = allocate_candidates(300, weights, capped.tolist(), even_share=0.0)
    # 59 to the first; 241 split 6:4 = 144.6 : 96.4, within caps 250 and 300.
    np.testing.assert_array_equal(shares, [59, 145, 96])
    assert shares.sum() == 300


def test_the_size_cap_halves_its_divisor_until_the_owners_can_supply_the_budget() -> None:
    """Two owners of 10 points, 20 reads, c = 4: ceil(10/4) = 3 each (6 < 20), c = 2: 5 each
    (10 < 20), c = 1: their whole tables; the budget is conserved."""
    np.testing.assert_array_equal(size_read_caps([10, 10], [10, 10], 4.0, 20), [10, 10])
    np.testing.assert_array_equal(size_read_caps([10, 10], [10, 10], 4.0, 10), [5, 5])
    np.testing.assert_array_equal(size_read_caps([10, 10], [10, 10], 4.0, 6), [3, 3])


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 500),
    weights=st.lists(st.floats(0, 1e4), min_size=1, max_size=12),
    data=st.data(),
    divisor=st.floats(0.1, 50),
)
def test_the_size_cap_holds_and_conserves_the_budget(budget, weights, data, divisor) -> None:
    """Every share is within its capacity cap, and within ceil(n_k / c) whenever the capped
    owners can supply the budget; the shares always sum to min(budget, sum(caps))."""
    k = len(weights)
    sizes = data.draw(st.lists(st.integers(0, 200), min_size=k, max_size=k))
    caps = [min(s, data.draw(st.integers(0, 200))) for s in sizes]
    capped = size_read_caps(caps, sizes, divisor, budget)
    shares = allocate_candidates(budget, weights, capped.tolist(), even_share=0.0)
    assert shares.sum() == min(budget, sum(caps))
    assert (shares <= np.asarray(caps)).all()
    by_size = np.minimum(caps, np.ceil(np.asarray(sizes) / divisor))
    if by_size.sum() >= min(budget, sum(caps)):
        assert (shares <= by_size).all()


def test_the_size_cap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="divisor"):
        size_read_caps([1], [1], 0.0, 1)
    with pytest.raises(ValueError, match=">= 0"):
        size_read_caps([1], [-1], 2.0, 1)
    with pytest.raises(ValueError, match="length"):
        size_read_caps([1, 2], [1], 2.0, 1)


def test_the_mass_cap_moves_an_owners_excess_over_its_mass_share_to_the_others() -> None:
    """tv16-40's pattern in small: the decision votes 90 % for an owner of 236 points that holds
    5 % of the owners' mass near D_v; 300 targeted reads.

    Control (old code, no cap): the owner gets its whole 236-point capacity, [236, 38, 26]. With
    c = 4 its reads are at most ceil(4 * 300 * 0.05) = 60 and the other 240 go to the others in
    proportion to their weights (6:4), the budget conserved. An owner whose mass share supports
    its vote keeps it: with masses 90 : 6 : 4 and c = 1 the shares are the old ones."""
    weights = [0.9, 0.06, 0.04]
    old = allocate_candidates(300, weights, [236, 300, 300], even_share=0.0)
    np.testing.assert_array_equal(old, [236, 38, 26])
    capped = mass_read_caps([236, 300, 300], [1.0, 9.0, 10.0], 4.0, 300)
    np.testing.assert_array_equal(capped, [60, 300, 300])
    shares = allocate_candidates(300, weights, capped.tolist(), even_share=0.0)
    np.testing.assert_array_equal(shares, [60, 144, 96])
    # Masses 90 : 6 : 4 at c = 1 cap the others at 18 and 12 (266 < 300), so c doubles to 4.
    kept = mass_read_caps([236, 300, 300], [90.0, 6.0, 4.0], 1.0, 300)
    np.testing.assert_array_equal(kept, [236, 72, 48])
    np.testing.assert_array_equal(
        allocate_candidates(300, weights, kept.tolist(), even_share=0.0), old
    )


def test_the_mass_cap_doubles_its_factor_until_the_owners_can_supply_the_budget() -> None:
    """Masses 1 : 1 : 2 of 20 reads, c = 0.25: caps ceil(1.25), ceil(1.25), ceil(2.5) = 2, 2, 3
    (7 < 20); c = 0.5: 3, 3, 5 (11); c = 1: 5, 5, 10 (20). No mass, or a budget only owners
    without mass can complete: the caps are left as they were."""
    np.testing.assert_array_equal(mass_read_caps([20, 20, 20], [1, 1, 2], 0.25, 20), [5, 5, 10])
    np.testing.assert_array_equal(mass_read_caps([20, 20, 20], [0, 0, 0], 4.0, 20), [20, 20, 20])
    np.testing.assert_array_equal(mass_read_caps([5, 20], [1, 0], 4.0, 20), [5, 20])


@settings(max_examples=200, deadline=None)
@given(
    budget=st.integers(0, 500),
    weights=st.lists(st.floats(0, 1e4), min_size=1, max_size=12),
    data=st.data(),
    factor=st.floats(0.05, 50),
)
def test_the_mass_cap_holds_and_conserves_the_budget(budget, weights, data, factor) -> None:
    """The shares always sum to min(budget, sum(caps)) within the capacity caps (so the session
    reads at most its budget, 3p), and within ceil(c * amount * share_k) whenever the owners so
    capped can supply the budget."""
    k = len(weights)
    caps = data.draw(st.lists(st.integers(0, 200), min_size=k, max_size=k))
    masses = data.draw(st.lists(st.floats(0, 1e3), min_size=k, max_size=k))
    capped = mass_read_caps(caps, masses, factor, budget)
    assert (capped <= np.asarray(caps)).all()
    shares = allocate_candidates(budget, weights, capped.tolist(), even_share=0.0)
    need = min(budget, sum(caps))
    assert shares.sum() == need
    assert (shares <= np.asarray(caps)).all()
    total = sum(masses)
    if total > 0:
        by_mass = np.minimum(caps, np.ceil(factor * need * np.asarray(masses) / total))
        if by_mass.sum() >= need:
            assert (shares <= by_mass).all()


def test_the_mass_cap_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="factor"):
        mass_read_caps([1], [1.0], 0.0, 1)
    with pytest.raises(ValueError, match=">= 0"):
        mass_read_caps([1], [-1.0], 2.0, 1)
    with pytest.raises(ValueError, match="length"):
        mass_read_caps([1, 2], [1.0], 2.0, 1)
    with pytest.raises(ValueError):
        mass_read_caps([1], [float("nan")], 2.0, 1)


def test_allocation_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        allocate_candidates(10, [-1.0, 1.0], [5, 5], even_share=0.2)
    with pytest.raises(ValueError, match="shape"):
        allocate_candidates(10, [1.0, 1.0], [5], even_share=0.2)
    with pytest.raises(ValueError, match="even_share"):
        allocate_candidates(10, [1.0], [5], even_share=1.5)


def test_shrinkage_has_the_james_stein_factor() -> None:
    prior = np.array([1.0, -2.0, 0.5, 0.0])
    y = np.array([3.0, 0.0, 0.0, 4.0])  # ||y||^2 = 25
    shrunk, alpha = shrink_embedding(prior + y, prior, 2.0)
    assert alpha == pytest.approx(1 - (4 - 2) * 4.0 / 25)
    np.testing.assert_allclose(shrunk, prior + alpha * y)
    # Positive part: a release within its noise of the prior is the prior.
    shrunk, alpha = shrink_embedding(prior + 0.1 * y, prior, 2.0)
    assert alpha == 0.0
    np.testing.assert_array_equal(shrunk, prior)
    # Two coordinates or fewer: James-Stein does not dominate, nothing is shrunk.
    assert shrink_embedding([1.0, 2.0], [0.0, 0.0], 5.0) == (pytest.approx([1.0, 2.0]), 1.0)


def test_shrinkage_beats_the_raw_release_when_the_noise_dominates() -> None:
    """d = 140, ||g - prior||^2 = d sigma^2 / 10. The raw release's squared error is sigma^2
    chi^2_140 (mean 140 sigma^2, std 16.7 sigma^2); the shrunk one's is at most about
    ||g - prior||^2 + 2 sigma^2 = 16 sigma^2. Over 200 seeded draws the means differ by ~100
    standard errors: the assertion (shrunk < 0.5 raw, and raw within 5 standard errors of
    140 sigma^2) fails with probability < 1e-6. A large signal is left almost unchanged."""
    rng = np.random.default_rng(7)
    d, sigma = 140, 0.3
    prior = rng.normal(size=d)
    g = prior + rng.normal(size=d) * sigma / np.sqrt(10)
    raw_err, shrunk_err = [], []
    for _ in range(200):
        noisy = g + rng.normal(scale=sigma, size=d)
        shrunk, alpha = shrink_embedding(noisy, prior, sigma)
        assert 0.0 <= alpha <= 1.0
        raw_err.append(float(np.sum((noisy - g) ** 2)))
        shrunk_err.append(float(np.sum((shrunk - g) ** 2)))
    assert abs(np.mean(raw_err) - d * sigma**2) < 5 * np.sqrt(2 * d) * sigma**2 / np.sqrt(200)
    assert np.mean(shrunk_err) < 0.5 * np.mean(raw_err)
    far = prior + 100 * sigma * np.ones(d) / np.sqrt(d)  # ||g - prior|| = 100 sigma
    _, alpha = shrink_embedding(far + rng.normal(scale=sigma, size=d), prior, sigma)
    assert alpha > 0.98


def test_shrinkage_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="noise_sigma"):
        shrink_embedding([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], 0.0)
    with pytest.raises(ValueError, match="prior"):
        shrink_embedding([1.0, 2.0, 3.0], [0.0, 0.0], 1.0)
    with pytest.raises(ValueError, match="noisy"):
        shrink_embedding([1.0, np.nan, 3.0], [0.0, 0.0, 0.0], 1.0)


def test_score_metric_shrinkage_has_the_plug_in_factor() -> None:
    """alpha = 1 - sigma^2 tr(Sigma) / r^T Sigma r, clipped to [0, 1]; with Sigma = I it is
    James-Stein's factor with d in place of d - 2."""
    prior = np.array([1.0, -2.0, 0.5, 0.0])
    r = np.array([3.0, 0.0, 0.0, 4.0])
    second = np.diag([1.0, 0.5, 0.25, 0.0])  # r^T S r = 9, tr S = 1.75
    shrunk, alpha = shrink_in_score_metric(prior + r, prior, second, 2.0)
    assert alpha == pytest.approx(1 - 4.0 * 1.75 / 9.0)
    np.testing.assert_allclose(shrunk, prior + alpha * r)
    _, alpha = shrink_in_score_metric(prior + r, prior, np.eye(4), 1.0)
    assert alpha == pytest.approx(1 - 4 * 1.0 / 25)
    # Noise the metric does not see leaves the release as it is; a release within the noise of
    # the prior, or on it, is the prior.
    assert shrink_in_score_metric(prior + r, prior, np.diag([1.0, 0, 0, 0]), 0.1)[1] > 0.99
    assert shrink_in_score_metric(prior + 0.1 * r, prior, second, 2.0)[1] == 0.0
    assert shrink_in_score_metric(prior, prior, second, 2.0) == (pytest.approx(prior), 0.0)
    with pytest.raises(ValueError, match="second_moment"):
        shrink_in_score_metric(prior + r, prior, np.eye(3), 1.0)
    with pytest.raises(ValueError, match="noise_sigma"):
        shrink_in_score_metric(prior + r, prior, second, 0.0)


def test_score_metric_shrinkage_serves_the_owners_scores_better_than_james_stein() -> None:
    """An owner holding D_v's kind as a tenth of its points, m = 30 at epsilon 1 (sigma 0.28,
    d = 140): James-Stein in R^d charges all 140 coordinates of noise (d sigma^2 = 11 against a
    signal ||g - mu||^2 below 1) and takes the owner's own mean (alpha ~ 0.08), whose scores
    miss D_v; in the metric of the owner's scores the noise is sigma^2 tr(Sigma) ~ 0.08 and the
    release is kept about half. Over 200 seeded draws (standard errors 0.003 and 0.0014 of means
    0.061 and 0.103) the mean score error is below 0.8 times James-Stein's and below the raw
    release's; the control: James-Stein's own loss, in R^d, is the lower for James-Stein."""
    rng = np.random.default_rng(3)
    d, sigma = 140, 0.28
    rff = draw_rff_params(2, d, 0.5, rng)
    owner = np.concatenate([rng.normal(0, 1, (900, 2)), rng.normal(3, 0.5, (100, 2))])
    h = random_fourier_features(owner, rff, dtype=np.float64)
    mu, second = h.mean(axis=0), h.T @ h / h.shape[0]
    g = validation_embedding(
        random_fourier_features(rng.normal(3, 0.5, (30, 2)), rff, dtype=np.float64)
    )
    errors: dict[str, list[float]] = {"raw": [], "js": [], "scores": []}
    plain: dict[str, list[float]] = {"js": [], "scores": []}
    alphas: dict[str, list[float]] = {"js": [], "scores": []}
    for _ in range(200):
        noisy = g + rng.normal(0, sigma, d)
        js, alpha_js = shrink_embedding(noisy, mu, sigma)
        ours, alpha_ours = shrink_in_score_metric(noisy, mu, second, sigma)
        for key, target in (("raw", noisy), ("js", js), ("scores", ours)):
            errors[key].append(float((target - g) @ second @ (target - g)))
        plain["js"].append(float(np.sum((js - g) ** 2)))
        plain["scores"].append(float(np.sum((ours - g) ** 2)))
        alphas["js"].append(alpha_js)
        alphas["scores"].append(alpha_ours)
    assert np.mean(alphas["js"]) < 0.2 < 0.3 < np.mean(alphas["scores"])
    assert np.mean(errors["scores"]) < 0.8 * np.mean(errors["js"])
    assert np.mean(errors["scores"]) < np.mean(errors["raw"])
    assert np.mean(plain["js"]) < np.mean(plain["scores"])


def test_an_owner_shrinks_in_its_score_metric_from_its_own_points() -> None:
    """shrink_towards_points with score_metric is shrink_in_score_metric towards the points'
    mean h1 with their second moment (and without it, James-Stein's)."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(50, 12))
    noisy = x[:5].mean(axis=0) + rng.normal(0, 0.2, 12)
    mean, second = x.mean(axis=0), x.T @ x / 50
    shrunk, alpha, public = shrink_towards_points(noisy, x, 0.2, score_metric=True)
    expected, expected_alpha = shrink_in_score_metric(noisy, mean, second, 0.2)
    assert alpha == pytest.approx(expected_alpha) and not public
    np.testing.assert_allclose(shrunk, expected)
    assert shrink_towards_points(noisy, x, 0.2)[1] == pytest.approx(
        shrink_embedding(noisy, mean, 0.2)[1]
    )


def test_the_strength_is_the_release_signal_energy_over_its_noise_energy() -> None:
    """Known answers: ||gtilde||^2 = d a^2 with noise sigma per coordinate gives
    ``snr = a^2 / sigma^2 - 1`` (capped at 1) and ``share = 1 - sigma^2 / a^2``; ``fixed`` is
    James-Stein's strength 1 whatever the release (the old default). (Old code: no strength rule,
    every release got 1.)"""
    d, sigma = 140, 0.2
    for a, snr, share in ((1.2 * sigma, 0.44, 1 - 1 / 1.44), (0.9 * sigma, 0.0, 0.0)):
        y = np.full(d, a)
        assert shrinkage_strength(y, sigma, "snr") == pytest.approx(snr)
        assert shrinkage_strength(y, sigma, "share") == pytest.approx(share)
        assert shrinkage_strength(y, sigma, "fixed") == 1.0
    # Signal energy at least the noise energy: James-Stein's amount, not more.
    assert shrinkage_strength(np.full(d, 3 * sigma), sigma, "snr") == 1.0
    assert shrinkage_strength(np.zeros(d), sigma, "share") == 0.0
    assert set(SHRINKAGE_STRENGTHS) == {"fixed", "snr", "share"}


def test_the_strength_reads_m_through_the_noise() -> None:
    """The same D_v's embedding released with a small validation set's noise (sigma = 4.23 * 2 /
    m at epsilon 1, delta 1e-6: m = 30) and a large one's (m = 500): d = 140, ||g||^2 = 0.6.
    Pure noise gives ``||gtilde||^2 / sigma^2 ~ chi^2_140``, so over 200 seeded draws the mean
    strength is 0.048 (standard error 0.005): the assertion mean < 0.1 fails with probability
    < 1e-6, and max < 0.8 (chi^2_140 > 252) with probability 200 * 2.1e-8 = 4e-6. At m = 30 the
    signal is 0.05 of the noise energy (11.2), so the strength stays near pure noise's; at m = 500
    the noise energy is 0.04 and every draw gets 1 (a non-central chi^2 below 2 d: < 1e-12)."""
    rng = np.random.default_rng(3)
    d = 140
    g = rng.normal(size=d)
    g *= np.sqrt(0.6) / np.linalg.norm(g)
    for rule in ("snr", "share"):
        small = [
            shrinkage_strength(g + rng.normal(scale=4.23 * 2 / 30, size=d), 4.23 * 2 / 30, rule)
            for _ in range(200)
        ]
        noise = [shrinkage_strength(rng.normal(scale=0.3, size=d), 0.3, rule) for _ in range(200)]
        large = [
            shrinkage_strength(g + rng.normal(scale=4.23 * 2 / 500, size=d), 4.23 * 2 / 500, rule)
            for _ in range(200)
        ]
        assert np.mean(noise) < 0.1 and max(noise) < 0.8
        assert np.mean(small) < 0.15 and max(small) < 0.8
        if rule == "snr":
            assert min(large) == 1.0
        else:
            assert min(large) > 0.9


def test_the_strength_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="noise_sigma"):
        shrinkage_strength([1.0, 2.0, 3.0], 0.0)
    with pytest.raises(ValueError, match="rule"):
        shrinkage_strength([1.0, 2.0, 3.0], 1.0, "wiener")
    with pytest.raises(ValueError, match="noisy"):
        shrinkage_strength([1.0, np.inf, 3.0], 1.0)
