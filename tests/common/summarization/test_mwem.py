"""Tests for dpmarket.common.summarization.mwem: h2, the MWEM private mean (summarization paper,
Algorithm
2)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.summarization.mwem import MWEMRelease, MWEMState, h2_private_mean
from dpmarket.common.summarization.quantization import quantization_grid, quantize_features

DELTA = 2.0  # sensitivity of w(D_Q, i) and psi_i under replacement of one point


def _h1_like(rng: np.random.Generator, q: int, d: int) -> np.ndarray:
    """Features in [-sqrt(2/d), sqrt(2/d)] whose coordinate means are far from 0 (up to ~0.88)."""
    phase = rng.uniform(0, 2 * np.pi, d)
    return math.sqrt(2 / d) * np.cos(phase + rng.normal(0, 0.5, size=(q, d)))


@pytest.mark.parametrize(("d", "eta"), [(50, 0.5), (40, 1 / 40), (100, 0.5)])
def test_release_approximates_mean_within_theorem_4_bound(d: int, eta: float) -> None:
    """Max-norm error within Theorem 4 (adapted) plus the quantization error.

    In quantized units (divide by q, i.e. compare ``w/q``), with T = d^2 iterations:

    * MWEM (Theorem 4, Hardt et al. 2012, with the noise term scaled by our calibration's
      sensitivity Delta = 2): ``max_i |w(D_Q,i) - w(P_avg,i)| / q <= 2 sqrt(d ln|S| / T)
      + (3c + 2) Delta ln d / (q eps)`` with probability >= 1 - 2T / d^c; c = 5 gives at most
      2 d^2 / d^5 <= 1.6e-5.
    * Quantization (Hoeffding, each rounding error in an interval of length eta, union over d):
      ``max_i |w(D_Q,i)/q - sqrt(d/2) mean_i| <= eta sqrt(ln(2 d / beta) / (2 q))`` with
      probability >= 1 - beta, beta = 1e-6.

    The embedding is in h1 units, i.e. ``sqrt(2/d)`` times the quantized units. An
    implementation that does not learn (embedding 0) has error ~0.88 in quantized units, above
    every bound used here (<= 0.67).
    """
    rng = np.random.default_rng(d)
    q, eps, c, beta = 2000, 1e3, 5, 1e-6
    t_iter = d * d
    feats = _h1_like(rng, q, d)
    release = h2_private_mean(feats, epsilon=eps, iterations=t_iter, eta=eta, rng=rng)
    n_grid = quantization_grid(eta).size
    mwem_term = 2 * math.sqrt(d * math.log(n_grid) / t_iter) + (3 * c + 2) * DELTA * math.log(d) / (
        q * eps
    )
    quant_term = eta * math.sqrt(math.log(2 * d / beta) / (2 * q))
    bound = math.sqrt(2 / d) * (mwem_term + quant_term)
    true_mean = feats.mean(axis=0)
    assert np.abs(true_mean).max() * math.sqrt(d / 2) > mwem_term + quant_term
    err = np.abs(release.embedding - true_mean).max()
    assert err <= bound
    assert err > 0  # a private release is not exactly the mean


def test_release_fields_shapes_and_types() -> None:
    rng = np.random.default_rng(0)
    d, t_iter = 6, 11
    release = h2_private_mean(
        _h1_like(rng, 30, d), epsilon=0.5, iterations=t_iter, eta=0.5, rng=rng
    )
    assert isinstance(release, MWEMRelease)
    assert release.embedding.shape == (d,) and release.embedding.dtype == np.float64
    assert release.selected.shape == (t_iter,) and release.selected.dtype == np.int64
    assert release.measurements.shape == (t_iter,) and release.measurements.dtype == np.float64
    assert ((release.selected >= 0) & (release.selected < d)).all()
    assert release.epsilon == 0.5
    assert release.iterations == t_iter
    assert release.sensitivity == DELTA
    # The embedding is sqrt(2/d) times an average of marginal means in [-1, 1].
    assert (np.abs(release.embedding) <= math.sqrt(2 / d)).all()


def test_laplace_measurement_noise_follows_laplace_delta_over_epsilon() -> None:
    # mu_t - w(D_Q, i(t)) is the Laplace draw of iteration t, independent of i(t) and of the past,
    # so the T residuals of one call are i.i.d. Laplace(Delta / eps). KS test, threshold 1e-4.
    rng = np.random.default_rng(1)
    d, q, eps = 5, 40, 0.7
    sums = np.array([-30.0, -4.0, 0.0, 12.5, 40.0])
    state = MWEMState(d, 0.25)
    release = state.release(sums, q, 5000, eps, rng)
    residuals = release.measurements - sums[release.selected]
    result = stats.kstest(residuals, stats.laplace(scale=DELTA / eps).cdf)
    assert result.pvalue > 1e-4
    # The wrong calibration (the paper's printed Lap(1/eps)) is rejected by the same test.
    wrong = stats.kstest(residuals, stats.laplace(scale=1 / eps).cdf)
    assert wrong.pvalue < 1e-4


def test_selection_frequencies_follow_softmax() -> None:
    # First iteration from the uniform state: w(P_0, i) = 0, so psi_i = |w(D_Q, i)| and
    # P[i(1) = i] = softmax(eps * psi / (2 Delta))_i. Chi-square test, threshold 1e-4.
    rng = np.random.default_rng(2)
    d, q, eps, n = 5, 10, 1.0, 20_000
    sums = np.array([0.0, -2.0, 4.0, -6.0, 8.0])
    logits = eps * np.abs(sums) / (2 * DELTA)
    expected = np.exp(logits - logits.max())
    expected /= expected.sum()
    picks = np.array(
        [MWEMState(d, 0.5).release(sums, q, 1, eps, rng).selected[0] for _ in range(n)]
    )
    observed = np.bincount(picks, minlength=d)
    result = stats.chisquare(observed, n * expected)
    assert result.pvalue > 1e-4
    # The printed calibration exp(eps * psi) would give visibly different frequencies.
    printed = np.exp(eps * np.abs(sums) - (eps * np.abs(sums)).max())
    printed /= printed.sum()
    assert stats.chisquare(observed, n * printed).pvalue < 1e-4


def test_marginals_are_product_form_probability_vectors() -> None:
    rng = np.random.default_rng(3)
    d, eta = 7, 0.25
    state = MWEMState(d, eta)
    n_grid = quantization_grid(eta).size
    np.testing.assert_allclose(state.marginals, 1 / n_grid)
    assert state.marginals.shape == (d, n_grid)
    feats = _h1_like(rng, 50, d)
    # Small epsilon: large Laplace noise and large exponents exercise the log-space update.
    for eps in (1e-3, 1.0, 1e4):
        h2_private_mean(feats, epsilon=eps, iterations=200, eta=eta, rng=rng, state=state)
        p = state.marginals
        assert p.shape == (d, n_grid)
        assert np.isfinite(p).all() and (p >= 0).all()
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=1e-12)
    assert state.grid.shape == (n_grid,)
    assert state.d == d and state.eta == eta


def test_only_selected_marginals_change() -> None:
    rng = np.random.default_rng(4)
    d = 6
    state = MWEMState(d, 0.5)
    before = state.marginals
    release = state.release(np.array([3.0, -3.0, 1.0, 0.0, 2.0, -1.0]), 4, 3, 1.0, rng)
    changed = np.flatnonzero(np.abs(state.marginals - before).max(axis=1) > 0)
    assert set(changed) <= set(release.selected.tolist())
    assert len(changed) >= 1


def test_update_moves_marginal_mean_towards_measurement() -> None:
    # One iteration: the selected marginal mean moves from w(P_0)/q = 0 toward mu/q.
    rng = np.random.default_rng(5)
    state = MWEMState(3, 0.5)
    release = state.release(np.array([9.0, 9.0, 9.0]), 10, 1, 1e3, rng)
    i = int(release.selected[0])
    mean_i = float(state.marginals[i] @ state.grid)
    assert release.measurements[0] > 8.9
    assert 0 < mean_i < 1
    # The release averages P_1 only: embedding_i = sqrt(2/d) * mean_i, others 0.
    expected = np.zeros(3)
    expected[i] = math.sqrt(2 / 3) * mean_i
    np.testing.assert_allclose(release.embedding, expected, atol=1e-15)


def test_warm_start_continues_from_previous_marginals() -> None:
    # Each iteration consumes the generator in the same order, so T = a + b in one call equals
    # a then b on the same state with the same generator.
    sums = np.array([5.0, -7.0, 2.0, 0.5])
    q, eps = 8, 2.0
    one = MWEMState(4, 0.25)
    r_all = one.release(sums, q, 30, eps, np.random.default_rng(6))
    two = MWEMState(4, 0.25)
    rng = np.random.default_rng(6)
    r_a = two.release(sums, q, 12, eps, rng)
    after_a = two.marginals
    r_b = two.release(sums, q, 18, eps, rng)
    np.testing.assert_array_equal(one.marginals, two.marginals)
    np.testing.assert_array_equal(r_all.selected, np.concatenate([r_a.selected, r_b.selected]))
    np.testing.assert_array_equal(
        r_all.measurements, np.concatenate([r_a.measurements, r_b.measurements])
    )
    # The second call did not restart from uniform: a fresh state gives another result.
    fresh = MWEMState(4, 0.25).release(sums, q, 18, eps, np.random.default_rng(7))
    assert not np.allclose(after_a, 1 / 5)
    assert not np.array_equal(fresh.embedding, r_b.embedding)


def test_h2_private_mean_uses_given_state() -> None:
    rng = np.random.default_rng(8)
    feats = _h1_like(rng, 20, 5)
    state = MWEMState(5, 0.5)
    h2_private_mean(feats, epsilon=1.0, iterations=10, eta=0.5, rng=rng, state=state)
    assert not np.allclose(state.marginals, 1 / 5)


def test_h2_matches_release_on_quantized_sums() -> None:
    feats = _h1_like(np.random.default_rng(9), 25, 4)
    r1 = h2_private_mean(feats, epsilon=1.0, iterations=15, eta=0.5, rng=np.random.default_rng(10))
    rng = np.random.default_rng(10)
    sums = quantize_features(feats, 0.5, rng).sum(axis=0)
    r2 = MWEMState(4, 0.5).release(sums, 25, 15, 1.0, rng)
    np.testing.assert_array_equal(r1.embedding, r2.embedding)
    np.testing.assert_array_equal(r1.selected, r2.selected)


def test_same_seed_same_release() -> None:
    feats = _h1_like(np.random.default_rng(11), 25, 4)
    kwargs = {"epsilon": 0.3, "iterations": 20, "eta": 0.25}
    a = h2_private_mean(feats, rng=np.random.default_rng(12), **kwargs)  # type: ignore[arg-type]
    b = h2_private_mean(feats, rng=np.random.default_rng(12), **kwargs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(a.embedding, b.embedding)


@pytest.mark.parametrize(
    ("sums", "q", "iterations", "epsilon", "match"),
    [
        (np.zeros(3), 0, 5, 1.0, "q"),
        (np.zeros(3), 2.5, 5, 1.0, "q"),
        (np.zeros(3), 4, 0, 1.0, "iterations"),
        (np.zeros(3), 4, 5, 0.0, "epsilon"),
        (np.zeros(3), 4, 5, -1.0, "epsilon"),
        (np.zeros(3), 4, 5, math.nan, "epsilon"),
        (np.array([0.0, math.nan, 0.0]), 4, 5, 1.0, "NaN"),
        (np.array([0.0, 4.5, 0.0]), 4, 5, 1.0, "4.5"),
        (np.zeros(4), 4, 5, 1.0, "length 3"),
    ],
)
def test_release_rejects_bad_input(
    sums: np.ndarray, q: float, iterations: int, epsilon: float, match: str
) -> None:
    state = MWEMState(3, 0.5)
    with pytest.raises(ValueError, match=match):
        state.release(sums, q, iterations, epsilon, np.random.default_rng(0))  # type: ignore[arg-type]
    np.testing.assert_array_equal(state.marginals, 1 / 5)


def test_state_and_h2_reject_bad_parameters() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="d must"):
        MWEMState(0, 0.5)
    with pytest.raises(ValueError, match="eta"):
        MWEMState(3, 0.3)
    feats = np.zeros((4, 3))
    with pytest.raises(ValueError, match="d=2"):
        h2_private_mean(feats, epsilon=1.0, iterations=3, eta=0.5, rng=rng, state=MWEMState(2, 0.5))
    with pytest.raises(ValueError, match="eta"):
        h2_private_mean(
            feats, epsilon=1.0, iterations=3, eta=0.5, rng=rng, state=MWEMState(3, 0.25)
        )
    with pytest.raises(ValueError, match="epsilon"):
        h2_private_mean(feats, epsilon=0.0, iterations=3, eta=0.5, rng=rng)
    with pytest.raises(ValueError, match="NaN"):
        h2_private_mean(np.full((2, 3), np.nan), epsilon=1.0, iterations=3, eta=0.5, rng=rng)
    with pytest.raises(ValueError, match="empty"):
        h2_private_mean(np.zeros((0, 3)), epsilon=1.0, iterations=3, eta=0.5, rng=rng)
