"""Tests for dpmarket.common.summarization.auction (PrivAuction, Algorithm 3 steps 11-16, Appendix
D)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpmarket.common.summarization.auction import (
    AuctionParams,
    ask_probabilities,
    auction_events,
    auction_parameters,
    choose_owners_to_ask,
    expected_points_per_round,
    parsimony_bound,
    rank_owners,
)

# ------------------------------------------------------------------------------------ parameters


@pytest.mark.parametrize(
    ("k", "tau"), [(1, 1), (2, 2), (8, 4), (10, 5), (27, 9), (64, 16), (100, 22), (1000, 100)]
)
def test_auction_parameters_formulas(k, tau) -> None:
    eps, delta = 0.5, 1e-5
    params = auction_parameters(eps, delta, k)
    assert params.tau == tau
    assert params.tau >= k ** (2 / 3) - 1e-9
    expected = eps / (3 * math.sqrt(2 * math.log(1 / delta))) * k ** (-1 / 3)
    assert params.eps_auc == pytest.approx(expected, rel=1e-12)


def test_auction_parameters_compose_to_a_third_of_epsilon() -> None:
    """Theorem 6's first term: sqrt(2 tau log(1/delta)) eps_auc = eps/3 when tau = K^(2/3)."""
    eps, delta, k = 1.0, 1e-6, 1000  # K^(2/3) = 100 exactly
    params = auction_parameters(eps, delta, k)
    assert math.sqrt(2 * params.tau * math.log(1 / delta)) * params.eps_auc == pytest.approx(
        eps / 3, rel=1e-12
    )


@pytest.mark.parametrize(
    ("epsilon", "delta", "k", "match"),
    [
        (0.0, 1e-5, 5, "epsilon must be a finite number > 0, got 0.0"),
        (-1.0, 1e-5, 5, "epsilon"),
        (float("nan"), 1e-5, 5, "epsilon"),
        (1.0, 0.0, 5, "delta must lie in"),
        (1.0, 1.0, 5, "delta must lie in"),
        (1.0, 1e-5, 0, "n_owners must be an integer >= 1, got 0"),
        (1.0, 1e-5, 2.5, "n_owners"),
    ],
)
def test_auction_parameters_errors(epsilon, delta, k, match) -> None:
    with pytest.raises(ValueError, match=match):
        auction_parameters(epsilon, delta, k)


def test_auction_params_validation() -> None:
    with pytest.raises(ValueError, match="eps_auc"):
        AuctionParams(eps_auc=0.0, tau=3)
    with pytest.raises(ValueError, match="tau"):
        AuctionParams(eps_auc=0.1, tau=0)
    with pytest.raises(ValueError, match="tau"):
        AuctionParams(eps_auc=0.1, tau=1.5)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------ ranking


def test_rank_owners_order_ties_and_nan() -> None:
    bids = np.array([0.5, np.nan, 0.9, 0.5, -1.0, 0.9, np.nan])
    assert rank_owners(bids).tolist() == [2, 5, 0, 3, 4]
    assert rank_owners(bids).dtype == np.int64
    assert rank_owners(np.full(3, np.nan)).tolist() == []
    assert rank_owners(np.array([])).tolist() == []


def test_rank_owners_errors() -> None:
    with pytest.raises(ValueError, match="inf"):
        rank_owners(np.array([0.1, np.inf]))
    with pytest.raises(ValueError, match="1-D"):
        rank_owners(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="real"):
        rank_owners(np.array(["a", "b"]))


# ------------------------------------------------------------------------------------ asking

bid_values = st.one_of(st.floats(-10, 10, allow_nan=False), st.just(float("nan")))


@settings(max_examples=200, deadline=None)
@given(
    bids=st.lists(bid_values, min_size=1, max_size=30),
    eps_auc=st.floats(1e-3, 5.0),
    tau=st.integers(1, 10),
    seed=st.integers(0, 2**32 - 1),
    data=st.data(),
)
def test_top_bidder_always_asked_and_nan_never(bids, eps_auc, tau, seed, data) -> None:
    b = np.array(bids)
    times_best = np.array(data.draw(st.lists(st.integers(0, 12), min_size=len(b), max_size=len(b))))
    ask = choose_owners_to_ask(
        b, times_best, AuctionParams(eps_auc, tau), np.random.default_rng(seed)
    )
    assert ask.shape == b.shape and ask.dtype == np.bool_
    assert not ask[np.isnan(b)].any()
    ranked = rank_owners(b)
    if ranked.size:
        assert ask[ranked[0]]
        # Every bidding owner that hit tau is asked.
        assert ask[ranked[times_best[ranked] >= tau]].all()
    else:
        assert not ask.any()


def test_tau_rule_forces_asking() -> None:
    # eps_auc = 60: a rank r >= 2 coin succeeds w.p. <= exp(-60) ~ 1e-26, so only rank 1 and the
    # tau rule ask (failure probability of this test <= 5 * 1e-26).
    params = AuctionParams(eps_auc=60.0, tau=3)
    bids = np.array([0.9, 0.1, 0.5, np.nan, 0.3, 0.2])
    times_best = np.array([0, 3, 2, 7, 5, 1])
    ask = choose_owners_to_ask(bids, times_best, params, np.random.default_rng(0))
    # Owner 0 (rank 1), owners 1 and 4 (times_best >= 3); owner 3 has no bid; owner 2 has 2 < 3.
    assert ask.tolist() == [True, True, False, False, True, False]


def test_ask_frequencies_match_exp_minus_eps_rank() -> None:
    """Rank r is asked w.p. exp(-eps_auc (r - 1)), independently.

    For each rank r >= 2 the number of asks in n rounds is Binomial(n, p_r); we accept counts
    inside the central interval of probability 1 - alpha (exact binomial quantiles), and the same
    for the joint event "ranks 2 and 3 both asked" (Binomial(n, p_2 p_3)); the mean number of asks
    per round (in [1, K]) is checked with Hoeffding at level alpha. Eleven checks at
    alpha = 1e-6 / 11, union bound: failure probability <= 1e-6 for a correct implementation.
    """
    k, eps_auc, n = 10, 0.3, 20_000
    params = AuctionParams(eps_auc=eps_auc, tau=10**6)
    rng = np.random.default_rng(4242)
    bids = rng.permutation(np.linspace(-1.0, 1.0, k))
    ranked = rank_owners(bids)
    times_best = np.zeros(k, dtype=np.int64)
    asks = np.array([choose_owners_to_ask(bids, times_best, params, rng) for _ in range(n)])
    by_rank = asks[:, ranked]
    assert by_rank[:, 0].all()
    alpha = 1e-6 / 11
    for r in range(2, k + 1):
        p = math.exp(-eps_auc * (r - 1))
        lo, hi = stats.binom.ppf(alpha / 2, n, p), stats.binom.isf(alpha / 2, n, p)
        assert lo <= by_rank[:, r - 1].sum() <= hi, f"rank {r}"
    p23 = math.exp(-eps_auc) * math.exp(-2 * eps_auc)
    both = int((by_rank[:, 1] & by_rank[:, 2]).sum())
    assert stats.binom.ppf(alpha / 2, n, p23) <= both <= stats.binom.isf(alpha / 2, n, p23)
    mean_asks = by_rank.sum(1).mean()
    hoeffding = (k - 1) * math.sqrt(math.log(2 / alpha) / (2 * n))
    assert abs(mean_asks - expected_points_per_round(k, eps_auc)) <= hoeffding


def test_coins_are_one_per_rank_in_rank_order() -> None:
    params = AuctionParams(eps_auc=0.4, tau=100)
    bids = np.array([0.3, np.nan, 0.8, 0.1, 0.5])
    times_best = np.zeros(5, dtype=np.int64)
    rng = np.random.default_rng(77)
    ask = choose_owners_to_ask(bids, times_best, params, rng)
    replay = np.random.default_rng(77)
    coins = replay.random(3)  # ranks 2, 3, 4 (owners 4, 0, 3); owner 1 has no bid
    expected = np.zeros(5, dtype=bool)
    expected[2] = True
    for j, owner in enumerate([4, 0, 3]):
        expected[owner] = coins[j] < math.exp(-0.4 * (j + 1))
    assert ask.tolist() == expected.tolist()
    assert rng.random() == replay.random()  # exactly three uniforms were consumed


def test_same_seed_same_asks() -> None:
    params = AuctionParams(eps_auc=0.2, tau=4)
    bid_rng = np.random.default_rng(1)
    rounds = [(bid_rng.normal(size=12), bid_rng.integers(0, 6, size=12)) for _ in range(50)]
    runs = []
    for seed in (9, 9, 10):
        rng = np.random.default_rng(seed)
        runs.append(np.array([choose_owners_to_ask(b, t, params, rng) for b, t in rounds]))
    assert np.array_equal(runs[0], runs[1])
    assert not np.array_equal(runs[0], runs[2])


def test_choose_owners_errors() -> None:
    params = AuctionParams(eps_auc=0.2, tau=4)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match=r"times_best must have shape \(3,\)"):
        choose_owners_to_ask(np.zeros(3), np.zeros(2, dtype=np.int64), params, rng)
    with pytest.raises(ValueError, match="integers"):
        choose_owners_to_ask(np.zeros(3), np.zeros(3), params, rng)
    with pytest.raises(ValueError, match="times_best must be >= 0, got -1 for owner 2"):
        choose_owners_to_ask(np.zeros(3), np.array([0, 0, -1]), params, rng)
    with pytest.raises(ValueError, match="inf"):
        choose_owners_to_ask(np.array([0.0, -np.inf]), np.zeros(2, dtype=np.int64), params, rng)


def test_no_bidders_draws_nothing() -> None:
    rng = np.random.default_rng(3)
    ask = choose_owners_to_ask(
        np.full(4, np.nan), np.zeros(4, dtype=np.int64), AuctionParams(0.1, 2), rng
    )
    assert not ask.any()
    assert rng.random() == np.random.default_rng(3).random()


# ------------------------------------------------------------------------------------ parsimony


def test_expected_points_per_round() -> None:
    for n, eps in [(1, 0.1), (5, 0.3), (100, 0.01), (1000, 2.0)]:
        direct = sum(math.exp(-eps * (r - 1)) for r in range(1, n + 1))
        assert expected_points_per_round(n, eps) == pytest.approx(direct, rel=1e-12)
    assert expected_points_per_round(0, 0.5) == 0.0
    with pytest.raises(ValueError, match="n_bidding"):
        expected_points_per_round(-1, 0.5)
    with pytest.raises(ValueError, match="eps_auc"):
        expected_points_per_round(3, 0.0)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10**6), eps=st.floats(1e-4, 20.0))
def test_geometric_sum_bound(n, eps) -> None:
    """sum_r exp(-eps (r-1)) <= 1/(1 - e^-eps) <= 1/eps + 1 (and > 1/eps for large n)."""
    value = expected_points_per_round(n, eps)
    assert 1.0 <= value <= 1.0 / eps + 1.0 + 1e-9
    assert 1.0 / -math.expm1(-eps) > 1.0 / eps  # the printed inequality of Lemma 5 is reversed


def test_parsimony_bound() -> None:
    params = auction_parameters(1.0, 1e-5, 27)  # tau = 9
    p, m = 100, 500
    bound = parsimony_bound(p, 27, params, m)
    assert bound == pytest.approx(p * (1 + 1 / params.eps_auc + 27 / 9) + m, rel=1e-12)
    # It dominates the exact expected coin-flip asks plus the sure bound on forced asks.
    assert bound >= p * expected_points_per_round(27, params.eps_auc) + p * 27 / 9 + m
    with pytest.raises(ValueError, match="validation_size"):
        parsimony_bound(p, 27, params, 0)
    with pytest.raises(ValueError, match="p must"):
        parsimony_bound(0, 27, params, m)


# ------------------------------------------------------------------------ pure variant
def test_pure_variant_asks_rank_one_with_probability_e_eps_over_one_plus_e_eps() -> None:
    """Rank 1 is asked as in randomized response, w.p. a = e^eps / (1 + e^eps) (not always).

    The number of rounds in which rank 1 is asked among n seeded draws is Binomial(n, a); it must
    lie in the central interval of probability 1 - 1e-6 (exact binomial quantiles), so a correct
    implementation fails with probability <= 1e-6; a rank 1 asked always (the printed variant)
    lies ~60 standard deviations above it.
    """
    k, eps_auc, n = 4, 0.5, 20_000
    params = AuctionParams(eps_auc=eps_auc, tau=10**6, variant="pure")
    rng = np.random.default_rng(20240607)
    bids = np.array([0.1, 0.9, -0.3, 0.4])
    top = int(rank_owners(bids)[0])
    asked = sum(
        bool(choose_owners_to_ask(bids, np.zeros(k, dtype=np.int64), params, rng)[top])
        for _ in range(n)
    )
    a = math.exp(eps_auc) / (1.0 + math.exp(eps_auc))
    alpha = 1e-6
    assert stats.binom.ppf(alpha / 2, n, a) <= asked <= stats.binom.isf(alpha / 2, n, a)


@pytest.mark.parametrize("eps_auc", [1e-4, 0.01, 0.3, 1.0, 4.0])
def test_pure_variant_is_exactly_eps_auc_dp_for_adjacent_ranks(eps_auc: float) -> None:
    """Moving one rank changes both "asked" and "not asked" by at most e^eps_auc, both ways.

    The largest eps_auc the curator's default policy admits is about 4 (rounds method without
    a summary release, epsilon_owners_total <= 4). Far beyond it the float rank-1 probability
    rounds ``1 - q`` visibly: at eps_auc = 30, ``1 - q`` is 9.348e-14 instead of 9.358e-14 and
    the "not asked" ratio exceeds e^eps_auc by 0.1%.
    """
    q = ask_probabilities(60, AuctionParams(eps_auc=eps_auc, tau=1, variant="pure"))
    bound = math.exp(eps_auc) * (1.0 + 1e-12)
    asked, not_asked = q, 1.0 - q
    for r in range(len(q) - 1):
        for p_now, p_next in ((asked[r], asked[r + 1]), (not_asked[r], not_asked[r + 1])):
            assert p_now > 0 and p_next > 0
            assert p_now / p_next <= bound, (r, p_now, p_next)
            assert p_next / p_now <= bound, (r, p_now, p_next)
    # The bound is attained: "asked" at every rank, "not asked" between ranks 1 and 2.
    assert asked[0] / asked[1] == pytest.approx(math.exp(eps_auc), rel=1e-12)
    assert not_asked[1] / not_asked[0] == pytest.approx(math.exp(eps_auc), rel=1e-9)


def test_paper_variant_not_asked_ratio_between_ranks_one_and_two_is_unbounded() -> None:
    """Algorithm 3 as printed always asks rank 1, so "not asked" has probability 0 at rank 1 and
    1 - e^-eps_auc at rank 2: no finite epsilon bounds it (hence its approximate charge)."""
    eps_auc = 0.3
    q = ask_probabilities(5, AuctionParams(eps_auc=eps_auc, tau=1, variant="paper"))
    not_asked = 1.0 - q
    assert not_asked[0] == 0.0 and not_asked[1] == pytest.approx(-math.expm1(-eps_auc))
    with np.errstate(divide="ignore"):
        ratio = np.float64(not_asked[1]) / np.float64(not_asked[0])
    assert ratio == math.inf
    # "Asked" alone is fine: e^eps_auc between adjacent ranks.
    np.testing.assert_allclose(q[:-1] / q[1:], math.exp(eps_auc), rtol=1e-12)
    (event,) = auction_events(AuctionParams(eps_auc=eps_auc, tau=4, variant="paper"))
    assert (event.mechanism, event.count) == ("approximate", 4)
    assert event.delta == pytest.approx(not_asked[1], rel=1e-15)
    (pure,) = auction_events(AuctionParams(eps_auc=eps_auc, tau=4, variant="pure"))
    assert (pure.mechanism, pure.epsilon, pure.count, pure.delta) == ("pure", eps_auc, 4, 0.0)
