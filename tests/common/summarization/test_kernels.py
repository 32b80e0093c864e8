"""Tests for dpmarket.common.summarization.kernels: Eq. 1, Eq. 3, Lemma 3 and the non-private greedy
baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmarket.common.summarization.kernels import (
    bid_direction,
    bid_scores,
    check_kernel_width,
    embedding_greedy,
    exact_kernel_greedy,
    exact_kernel_summary,
    exchange_refine,
    marginal_gain_score,
    mmd2,
    mmd2_rff,
    objective_j,
    rbf_kernel,
    rff_greedy,
    suggested_gamma,
)
from dpmarket.common.summarization.rff import draw_rff_params, random_fourier_features

GAMMA = 0.3


def _dense_mmd2(x: np.ndarray, y: np.ndarray, gamma: float) -> float:
    """Eq. 1 written out with dense kernel matrices."""
    kxx = np.exp(-gamma * ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    kyy = np.exp(-gamma * ((y[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    kxy = np.exp(-gamma * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    return float(kxx.mean() - 2 * kxy.mean() + kyy.mean())


def _dense_j(summary: np.ndarray, validation: np.ndarray, gamma: float) -> float:
    """Eq. 3, right-hand side, with dense kernel matrices."""
    m, q = len(validation), len(summary)
    return float(
        2 * rbf_kernel(validation, summary, gamma).sum() / (m * q)
        - rbf_kernel(summary, summary, gamma).sum() / q**2
    )


@pytest.fixture
def data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(314)
    return {
        "pool": rng.normal(size=(60, 4)),
        "validation": rng.normal(loc=0.4, size=(25, 4)),
        "seed": rng.normal(size=(5, 4)),
    }


# ------------------------------------------------------------------------------------ kernels


def test_rbf_kernel_matches_definition(data) -> None:
    x, y = data["pool"], data["validation"]
    direct = np.exp(-GAMMA * ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1))
    k = rbf_kernel(x, y, GAMMA)
    assert k.shape == (60, 25) and k.dtype == np.float64
    np.testing.assert_allclose(k, direct, rtol=0, atol=1e-12)


def test_rbf_kernel_errors() -> None:
    with pytest.raises(ValueError, match="gamma"):
        rbf_kernel(np.zeros((2, 2)), np.zeros((2, 2)), 0.0)
    with pytest.raises(ValueError, match="2 features"):
        rbf_kernel(np.zeros((2, 2)), np.zeros((2, 3)), 1.0)


def test_mmd2_matches_dense(data) -> None:
    x, y = data["pool"], data["validation"]
    expected = _dense_mmd2(x, y, GAMMA)
    assert mmd2(x, y, GAMMA) == pytest.approx(expected, abs=1e-12)
    assert mmd2(y, x, GAMMA) == pytest.approx(expected, abs=1e-12)


def test_mmd2_chunked_equals_unchunked(data) -> None:
    x, y = data["pool"], data["validation"]
    ref = mmd2(x, y, GAMMA, chunk_size=10_000)
    for chunk in (1, 3, 7, 16, 59):
        assert mmd2(x, y, GAMMA, chunk_size=chunk) == pytest.approx(ref, abs=1e-12)


def test_mmd2_of_a_set_with_itself_is_zero(data) -> None:
    x = data["pool"]
    assert mmd2(x, x, GAMMA) == pytest.approx(0.0, abs=1e-12)
    assert mmd2(x, x, GAMMA, chunk_size=7) == pytest.approx(0.0, abs=1e-12)
    assert mmd2(x, x, GAMMA) >= 0.0


def test_mmd2_errors(data) -> None:
    x = data["pool"]
    with pytest.raises(ValueError, match="empty"):
        mmd2(np.empty((0, 4)), x, GAMMA)
    with pytest.raises(ValueError, match="empty"):
        mmd2(x, np.empty((0, 4)), GAMMA)
    with pytest.raises(ValueError, match="4 features"):
        mmd2(x, np.zeros((3, 5)), GAMMA)
    bad = x.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        mmd2(bad, x, GAMMA)
    with pytest.raises(ValueError, match="gamma"):
        mmd2(x, x, -1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        mmd2(x, x, GAMMA, chunk_size=0)


def test_mmd2_rff_is_the_feature_space_mmd(data) -> None:
    params = draw_rff_params(4, 50, GAMMA, np.random.default_rng(0))
    fx = random_fourier_features(data["pool"], params, dtype=np.float64)
    fy = random_fourier_features(data["validation"], params, dtype=np.float64)
    # Eq. 1 with the kernel h1(x) . h1(y).
    expected = (fx @ fx.T).mean() - 2 * (fx @ fy.T).mean() + (fy @ fy.T).mean()
    assert mmd2_rff(fx, fy) == pytest.approx(expected, abs=1e-12)
    assert mmd2_rff(fx, fx) == 0.0
    with pytest.raises(ValueError, match="50 features"):
        mmd2_rff(fx, fy[:, :10])
    with pytest.raises(ValueError, match="empty"):
        mmd2_rff(fx[:0], fy)


# ------------------------------------------------------------------------------------ Eq. 3


def test_objective_j_identity(data) -> None:
    s, v = data["pool"][:12], data["validation"]
    mean_kvv = rbf_kernel(v, v, GAMMA).mean()
    lhs = mean_kvv - _dense_mmd2(v, s, GAMMA)
    assert objective_j(s, v, GAMMA) == pytest.approx(lhs, abs=1e-12)
    assert objective_j(s, v, GAMMA) == pytest.approx(_dense_j(s, v, GAMMA), abs=1e-12)
    # J(V) = mean k(v, v') (MMD = 0) is the maximum.
    assert objective_j(v, v, GAMMA) == pytest.approx(mean_kvv, abs=1e-12)


def test_objective_j_errors(data) -> None:
    with pytest.raises(ValueError, match="summary is empty"):
        objective_j(np.empty((0, 4)), data["validation"], GAMMA)
    with pytest.raises(ValueError, match="validation set is empty"):
        objective_j(data["pool"], np.empty((0, 4)), GAMMA)


@pytest.mark.parametrize("q", [1, 2, 7])
def test_marginal_gain_is_affine_in_score(data, q) -> None:
    """Lemma 3: J(S + y) - J(S) = 2/(q+1) score(y) + c(S), c(S) the same for every y."""
    s, v, candidates = data["pool"][:q], data["validation"], data["pool"][20:40]
    j_s = objective_j(s, v, GAMMA)
    gains = np.array([objective_j(np.vstack([s, y[None]]), v, GAMMA) - j_s for y in candidates])
    score = marginal_gain_score(candidates, v, s, GAMMA)
    residual = gains - 2 / (q + 1) * score
    assert np.ptp(residual) <= 1e-10
    # The swapped bid of Algorithm 3's text is not affine in the gain.
    swapped = rbf_kernel(candidates, s, GAMMA).mean(1) - q / (q + 1) * rbf_kernel(
        candidates, v, GAMMA
    ).mean(1)
    assert np.ptp(gains - 2 / (q + 1) * swapped) > 1e-3


def test_marginal_gain_empty_summary(data) -> None:
    v, candidates = data["validation"], data["pool"][:10]
    score = marginal_gain_score(candidates, v, np.empty((0, 4)), GAMMA)
    np.testing.assert_allclose(score, rbf_kernel(candidates, v, GAMMA).mean(1), atol=1e-14)
    # J({y}) = 2 score(y) - 1 (J of the empty set taken as 0).
    j_single = np.array([objective_j(y[None], v, GAMMA) for y in candidates])
    np.testing.assert_allclose(j_single, 2 * score - 1, atol=1e-12)


def test_marginal_gain_formula(data) -> None:
    s, v, c = data["seed"], data["validation"], data["pool"]
    q = len(s)
    expected = rbf_kernel(c, v, GAMMA).mean(1) - q / (q + 1) * rbf_kernel(c, s, GAMMA).mean(1)
    out = marginal_gain_score(c, v, s, GAMMA)
    assert out.shape == (60,) and out.dtype == np.float64
    np.testing.assert_allclose(out, expected, atol=1e-13)
    assert marginal_gain_score(c[:0], v, s, GAMMA).shape == (0,)
    with pytest.raises(ValueError, match="4 features"):
        marginal_gain_score(c, v, s[:, :3], GAMMA)


# ------------------------------------------------------------------------------------ bids


def test_bid_direction_and_scores() -> None:
    rng = np.random.default_rng(5)
    gv, gs = rng.normal(size=8), rng.normal(size=8)
    direction = bid_direction(gv, gs, 3)
    assert direction.dtype == np.float32 and direction.shape == (8,)
    np.testing.assert_allclose(direction, gv - 0.75 * gs, rtol=1e-6)
    np.testing.assert_array_equal(bid_direction(gv, gs, 0), gv.astype(np.float32))
    features = rng.normal(size=(30, 8)).astype(np.float32)
    scores = bid_scores(features, direction)
    assert scores.dtype == np.float32 and scores.shape == (30,)
    np.testing.assert_allclose(scores, features.astype(np.float64) @ direction, rtol=1e-5)


def test_bid_scores_estimate_marginal_gain_score(data) -> None:
    """With exact means of h1 and large d, the bids estimate marginal_gain_score.

    Each bid differs from the score by a mean of per-pair kernel errors; per pair, Bernstein
    (Var <= 1, range 3) with a union bound over the 60 * 30 pairs gives |error| <= t with
    probability >= 1 - 1e-6, so |bid - score| <= 2 t (validation term plus summary term).
    """
    d = 20_000
    pool, v, s = data["pool"], data["validation"], data["seed"]
    params = draw_rff_params(4, d, GAMMA, np.random.default_rng(17))
    fp = random_fourier_features(pool, params)
    gv = random_fourier_features(v, params, dtype=np.float64).mean(0)
    gs = random_fourier_features(s, params, dtype=np.float64).mean(0)
    bids = bid_scores(fp, bid_direction(gv, gs, len(s)))
    log_term = math.log(2 * 60 * 30 / 1e-6)
    t = (2 * log_term + math.sqrt(4 * log_term**2 + 8 * d * log_term)) / (2 * d)
    exact = marginal_gain_score(pool, v, s, GAMMA)
    assert np.abs(bids - exact).max() <= 2 * t + 1e-5  # + float32 rounding


def test_bid_errors() -> None:
    with pytest.raises(ValueError, match="length 3"):
        bid_direction(np.zeros(3), np.zeros(4), 1)
    with pytest.raises(ValueError, match="summary_size"):
        bid_direction(np.zeros(3), np.zeros(3), -1)
    with pytest.raises(ValueError, match="NaN"):
        bid_direction(np.array([0.0, np.nan]), np.zeros(2), 1)
    with pytest.raises(ValueError, match="length 3"):
        bid_scores(np.zeros((5, 3), dtype=np.float32), np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="2-D"):
        bid_scores(np.zeros(3, dtype=np.float32), np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="NaN"):
        bid_scores(np.zeros((5, 2), dtype=np.float32), np.array([np.inf, 0.0]))


# ------------------------------------------------------------------------------------ greedy


def _naive_greedy(pool, validation, seed, p, gamma) -> list[int]:
    """Greedy maximisation of J (Eq. 3) recomputing J(S + y) for every candidate y."""
    chosen: list[int] = []
    for _ in range(p):
        best, best_j = -1, -math.inf
        for i in range(len(pool)):
            if i in chosen:
                continue
            s = np.vstack([seed, pool[chosen], pool[i : i + 1]])
            j = _dense_j(s, validation, gamma)
            if j > best_j:
                best, best_j = i, j
        chosen.append(best)
    return chosen


@pytest.mark.parametrize("n_seed", [0, 5])
def test_exact_greedy_equals_naive(data, n_seed) -> None:
    pool, v, seed = data["pool"], data["validation"], data["seed"][:n_seed]
    idx = exact_kernel_greedy(pool, v, seed, 8, GAMMA)
    assert idx.dtype == np.int64 and idx.shape == (8,)
    assert idx.tolist() == _naive_greedy(pool, v, seed, 8, GAMMA)
    assert len(set(idx.tolist())) == 8


def test_exact_greedy_chunk_invariance(data) -> None:
    pool, v, seed = data["pool"], data["validation"], data["seed"]
    ref = exact_kernel_greedy(pool, v, seed, 20, GAMMA)
    for chunk in (1, 7, 64):
        np.testing.assert_array_equal(
            exact_kernel_greedy(pool, v, seed, 20, GAMMA, chunk_size=chunk), ref
        )


def test_exact_greedy_whole_pool_and_ties() -> None:
    # Two identical copies of the point closest to the validation set: the lower index goes first.
    v = np.array([[0.0, 0.0]])
    pool = np.array([[5.0, 5.0], [0.1, 0.0], [0.1, 0.0], [3.0, 0.0]])
    idx = exact_kernel_greedy(pool, v, np.empty((0, 2)), 4, 1.0)
    assert idx[0] == 1
    assert sorted(idx.tolist()) == [0, 1, 2, 3]


def test_exact_greedy_errors(data) -> None:
    pool, v, seed = data["pool"], data["validation"], data["seed"]
    with pytest.raises(ValueError, match="p must be <= the pool size 60, got 61"):
        exact_kernel_greedy(pool, v, seed, 61, GAMMA)
    with pytest.raises(ValueError, match="p must be an integer >= 1, got 0"):
        exact_kernel_greedy(pool, v, seed, 0, GAMMA)
    with pytest.raises(ValueError, match="4 features"):
        exact_kernel_greedy(pool, v[:, :2], seed, 3, GAMMA)
    with pytest.raises(ValueError, match="seed set must have 4 features"):
        exact_kernel_greedy(pool, v, seed[:, :2], 3, GAMMA)
    with pytest.raises(ValueError, match="validation set is empty"):
        exact_kernel_greedy(pool, v[:0], seed, 3, GAMMA)


def test_exchange_refine_reaches_a_swap_local_optimum(data) -> None:
    pool, v = data["pool"], data["validation"]
    empty = np.empty((0, pool.shape[1]))
    greedy = exact_kernel_greedy(pool, v, empty, 8, GAMMA)
    refined = exchange_refine(pool, v, greedy, GAMMA, max_passes=50)
    assert refined.dtype == np.int64 and sorted(set(refined.tolist())) == sorted(refined.tolist())
    before, after = mmd2(pool[greedy], v, GAMMA), mmd2(pool[refined], v, GAMMA)
    assert after <= before + 1e-12
    # No single exchange of a chosen point for an unchosen one lowers MMD² any further.
    chosen = set(refined.tolist())
    for s in chosen:
        for c in set(range(len(pool))) - chosen:
            swapped = [c if i == s else i for i in refined.tolist()]
            assert mmd2(pool[swapped], v, GAMMA) >= after - 1e-9
    # Returned in the greedy's order on the chosen points.
    order = exact_kernel_greedy(pool[refined], v, empty, 8, GAMMA)
    np.testing.assert_array_equal(order, np.arange(8))


def test_exact_kernel_summary_is_greedy_then_exchanges(data) -> None:
    pool, v = data["pool"], data["validation"]
    empty = np.empty((0, pool.shape[1]))
    greedy = exact_kernel_greedy(pool, v, empty, 12, GAMMA)
    summary = exact_kernel_summary(pool, v, 12, GAMMA)
    np.testing.assert_array_equal(summary, exchange_refine(pool, v, greedy, GAMMA))
    assert mmd2(pool[summary], v, GAMMA) <= mmd2(pool[greedy], v, GAMMA) + 1e-12


def test_exchange_refine_errors(data) -> None:
    pool, v = data["pool"], data["validation"]
    with pytest.raises(ValueError, match="distinct indices into a pool of 60 points"):
        exchange_refine(pool, v, [1, 1], GAMMA)
    with pytest.raises(ValueError, match="distinct indices into a pool of 60 points"):
        exchange_refine(pool, v, [60], GAMMA)
    with pytest.raises(ValueError, match="distinct indices into a pool of 60 points"):
        exchange_refine(pool, v, [], GAMMA)
    with pytest.raises(ValueError, match="max_passes must be an integer >= 1"):
        exchange_refine(pool, v, [0], GAMMA, max_passes=0)


def _naive_rff_greedy(fp, fv, fs, p) -> list[int]:
    """score(y) = mean_v h1(y).h1(v) - q/(q+1) mean_s h1(y).h1(s), recomputed from scratch."""
    chosen: list[int] = []
    for _ in range(p):
        s = np.vstack([fs, fp[chosen]])
        q = len(s)
        score = (fp @ fv.T).mean(1)
        if q:
            score = score - q / (q + 1) * (fp @ s.T).mean(1)
        score[chosen] = -np.inf
        chosen.append(int(np.argmax(score)))
    return chosen


@pytest.mark.parametrize("n_seed", [0, 5])
def test_rff_greedy_equals_naive(data, n_seed) -> None:
    params = draw_rff_params(4, 140, GAMMA, np.random.default_rng(3))
    fp, fv, fs = (
        random_fourier_features(a, params, dtype=np.float64)
        for a in (data["pool"], data["validation"], data["seed"][:n_seed])
    )
    idx = rff_greedy(fp, fv, fs, 15)
    assert idx.dtype == np.int64
    assert idx.tolist() == _naive_rff_greedy(fp, fv, fs, 15)


def test_rff_greedy_float32_is_the_owner_bid(data) -> None:
    params = draw_rff_params(4, 140, GAMMA, np.random.default_rng(3))
    fp, fv, fs = (
        random_fourier_features(a, params) for a in (data["pool"], data["validation"], data["seed"])
    )
    idx = rff_greedy(fp, fv, fs, 10)
    chosen: list[int] = []
    s_rows = fs.astype(np.float64)
    for _ in range(10):
        gs = s_rows.mean(0)
        bids = bid_scores(fp, bid_direction(fv.astype(np.float64).mean(0), gs, len(s_rows)))
        bids[chosen] = -np.inf
        chosen.append(int(np.argmax(bids)))
        s_rows = np.vstack([s_rows, fp[chosen[-1]].astype(np.float64)])
    assert idx.tolist() == chosen


def test_rff_greedy_matches_exact_greedy_on_separated_problem() -> None:
    """Six pool points far apart; validation points cluster near three of them (45, 30, 15).

    With d = 50,000 every pairwise h1 product is within t of the kernel w.p. >= 1 - 1e-6
    (Bernstein, Var <= 1, range 3, union over the pool x (validation + pool) pairs), so every
    RFF score is within 2 t of the exact score; the exact scores' gaps exceed 4 t, so both greedy
    runs make the same choices.
    """
    rng = np.random.default_rng(8)
    pool = 6.0 * np.eye(6)[:, :6]  # pairwise squared distance 72: k = exp(-21.6) ~ 4e-10
    counts = [45, 30, 15]
    v = np.vstack(
        [pool[i] + 0.05 * rng.normal(size=(c, 6)) for i, c in zip([4, 1, 3], counts, strict=True)]
    )
    d = 50_000
    log_term = math.log(2 * 6 * (len(v) + 6) / 1e-6)
    t = (2 * log_term + math.sqrt(4 * log_term**2 + 8 * d * log_term)) / (2 * d)
    # Precondition: the exact score gaps along the exact greedy path exceed 4 t.
    exact = exact_kernel_greedy(pool, v, np.empty((0, 6)), 3, GAMMA)
    for step in range(3):
        score = marginal_gain_score(pool, v, pool[exact[:step]], GAMMA)
        score[exact[:step]] = -np.inf
        top2 = np.sort(score)[-2:]
        assert top2[1] - top2[0] > 4 * t
    params = draw_rff_params(6, d, GAMMA, np.random.default_rng(21))
    fp, fv = (random_fourier_features(a, params, dtype=np.float64) for a in (pool, v))
    idx = rff_greedy(fp, fv, np.empty((0, d)), 3)
    assert idx.tolist() == exact.tolist() == [4, 1, 3]


def test_rff_greedy_errors() -> None:
    f = np.zeros((5, 3))
    with pytest.raises(ValueError, match="p must be <= the 5 available pool points"):
        rff_greedy(f, f, f[:0], 6)
    with pytest.raises(ValueError, match="length 3"):
        rff_greedy(f, np.zeros((2, 4)), f[:0], 1)
    with pytest.raises(ValueError, match="validation features is empty"):
        rff_greedy(f, f[:0], f[:0], 1)
    with pytest.raises(ValueError, match="NaN"):
        rff_greedy(np.full((5, 3), np.nan), f, f[:0], 1)


def test_embedding_greedy_skips_excluded_points_and_matches_rff_greedy() -> None:
    rng = np.random.default_rng(4)
    pool = rng.normal(size=(60, 8)).astype(np.float32)
    validation = rng.normal(size=(10, 8))
    seed = rng.normal(size=(2, 8))
    full = rff_greedy(pool, validation, seed, 12)
    np.testing.assert_array_equal(embedding_greedy(pool, validation.mean(axis=0), seed, 12), full)
    exclude = np.zeros(60, dtype=bool)
    exclude[full[:3]] = True
    chosen = embedding_greedy(pool, validation.mean(axis=0), seed, 12, exclude=exclude)
    assert not set(chosen) & set(full[:3])
    with pytest.raises(ValueError, match="57 available"):
        embedding_greedy(pool, validation.mean(axis=0), seed, 58, exclude=exclude)


def test_the_suggested_gamma_is_the_one_a_refusal_names_and_is_accepted() -> None:
    """On points in large units (a clinic's: BMI, blood pressure, progression) the method's
    default gamma 0.1 is refused; the refusal names 1 / median squared distance, which is
    :func:`suggested_gamma`, and that width is accepted with a median kernel value of exp(-1)."""
    rng = np.random.default_rng(0)
    points = rng.normal(0.0, 1.0, (60, 4)) * np.array([4.0, 14.0, 40.0, 77.0])
    with pytest.raises(ValueError, match="makes the RBF kernel") as refused:
        check_kernel_width(points, 0.1)
    gamma = suggested_gamma(points)
    assert f"= {gamma:.3g}" in str(refused.value)
    assert check_kernel_width(points, gamma) == pytest.approx(math.exp(-1.0), rel=1e-9)
    with pytest.raises(ValueError, match="at least 2"):
        suggested_gamma(points[:1])
    with pytest.raises(ValueError, match="most points repeat"):
        suggested_gamma(np.ones((5, 4)))


def test_a_width_refusal_never_advises_a_gamma_the_curator_refuses() -> None:
    """Raw house prices (sd about 1e5) read without a schema: the median heuristic's gamma is
    about 1e-11, below the curator's default range [1e-6, 1e6]. The refusal says the scale is
    the problem and that a schema declaring the public bounds makes the kernel read every
    feature scaled to [0, 1]; the gamma of the raw units only where a curator's policy widens
    its range. Controls (issue 28): the first message advised "a gamma around 1 / 9.5e+09 =
    1.05e-10", which the curator then refused; the second, to standardize each feature (mean
    0, sd 1) in every owner's data alike, which no public value fixes; the third (main before
    the kernel read scaled units), to rescale every feature to [0, 1] by hand in the validation
    set and every owner's table alike."""
    from dpmarket.common.summarization.kernels import GAMMA_RANGE
    from dpmarket.curator.policy import DEFAULT_RANGES

    assert DEFAULT_RANGES["gamma"] == GAMMA_RANGE
    points = np.clip(np.random.default_rng(0).normal(2e5, 1e5, (60, 2)), 0.0, 6e5)
    assert suggested_gamma(points) < GAMMA_RANGE[0]  # the heuristic's gamma: outside
    with pytest.raises(ValueError, match="features' scale is the problem") as refused:
        check_kernel_width(points, 1.0)
    message = str(refused.value)
    assert "a schema that declares each feature's public bounds" in message
    assert "the kernel then reads every feature scaled to [0, 1] by them" in message
    assert "Use a gamma around" not in message and "Standardize" not in message
    assert "in every owner's table alike" not in message  # nothing to rescale by hand
    raw = suggested_gamma(points)
    assert f"where the curator's policy widens its gamma range to hold it, --gamma {raw:.3g}" in (
        message
    )


def test_with_bounds_the_kernel_width_is_checked_in_scaled_units() -> None:
    """Given the schema's bounds, the width is checked on the points scaled to [0, 1] by them,
    as the session's kernel reads them: raw house prices at gamma 1 pass (median kernel value
    that of the scaled points), and a refusal names the gamma of the scaled units, which
    :func:`suggested_gamma` with the same bounds gives. Control: main checked the raw units,
    refusing gamma 1 ("features' scale is the problem")."""
    from dpmarket.common.summarization.kernels import GAMMA_RANGE

    points = np.clip(np.random.default_rng(0).normal(2e5, 1e5, (60, 2)), 0.0, 6e5)
    bounds = np.array([[0.0, 6e5], [0.0, 6e5]])
    scaled = points / 6e5
    assert check_kernel_width(points, 1.0, bounds=bounds) == check_kernel_width(scaled, 1.0)
    fits = suggested_gamma(points, bounds=bounds)
    assert fits == suggested_gamma(scaled)
    assert GAMMA_RANGE[0] <= fits <= GAMMA_RANGE[1]
    with pytest.raises(ValueError, match="Use a gamma around") as refused:
        check_kernel_width(points, 1e-9, bounds=bounds)
    message = str(refused.value)
    assert f"= {fits:.3g} (in units of each feature scaled to [0, 1] by its schema bounds)" in (
        message
    )
    assert check_kernel_width(points, float(f"{fits:.3g}"), bounds=bounds) == pytest.approx(
        math.exp(-1.0), rel=1e-2
    )
    with pytest.raises(ValueError, match="low < high"):
        check_kernel_width(points, 1.0, bounds=np.array([[0.0, 6e5], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="3 features"):
        check_kernel_width(points, 1.0, bounds=np.tile([0.0, 1.0], (3, 1)))


def test_feature_bounds_are_the_schemas_features_bounds() -> None:
    """The curator's session and ``request`` take the bounds from the schema, its features
    only, in order."""
    bounds = np.array([[0.0, 6e5], [0.0, 6e5]])
    from dpmarket.common.schema import Schema
    from dpmarket.common.summarization.kernels import feature_bounds

    schema = Schema.from_mapping(
        {
            "name": "houses",
            "label": "sold",
            "columns": [
                {"name": "price", "type": "integer", "low": 0, "high": 600000},
                {"name": "sold", "type": "binary"},
                {"name": "lot", "type": "continuous", "low": 0, "high": 6e5},
            ],
        }
    )
    np.testing.assert_array_equal(feature_bounds(schema), bounds)
    assert feature_bounds(None) is None


def test_a_bid_direction_holds_no_number_below_the_floor() -> None:
    """Embeddings just above the 1e-20 floor whose difference is far below it (a stranger:
    3e-36, whose products with float32 features were subnormal and made a bid round's time
    count the rows near a value): the direction's entry is 0; honest entries are kept. The
    control: the plain difference is 3e-36."""
    from dpmarket.common.summarization.kernels import _direction, bid_direction

    gv = np.array([2e-20, 0.3])
    gs = np.array([np.nextafter(4e-20, 0.0), 0.1])
    assert 0 < abs(_direction(gv, gs, 1)[0]) < 1e-30  # control
    direction = bid_direction(gv, gs, 1)
    assert direction[0] == 0.0 and direction[1] == np.float32(0.3 - 0.5 * 0.1)
