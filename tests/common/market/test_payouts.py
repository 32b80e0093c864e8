"""The payout release: its derived sensitivities hold against adversarial neighbours, its noise is
Laplace at the calibrated scale, its privacy loss stays within epsilon, and the reward rules pay
non-negative, exact amounts."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from scipy import stats

from dpmarket.common.market.attribution import (
    ObjectiveGame,
    SummaryBlocks,
    embedding_shapley,
    exact_shapley,
)
from dpmarket.common.market.payouts import (
    ProportionalSplit,
    ValueReward,
    payout_sensitivity,
    release_payouts,
)
from dpmarket.common.privacy.noise import SeededNoise

GAMMA = 1.0
FAR = 50.0  # k = exp(-GAMMA * FAR^2) is 0 to double precision


def _values(
    points: NDArray, ids: list[str], validation: NDArray, owners: tuple[str, ...]
) -> NDArray:
    blocks = SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=owners)
    return embedding_shapley(blocks).values


def _random_case(rng: np.random.Generator, p: int, m: int, k: int = 4):
    points = rng.normal(size=(p, 2))
    ids = [f"o{i}" for i in rng.integers(0, k, size=p)]
    owners = tuple(f"o{i}" for i in range(k))
    return points, ids, rng.normal(size=(m, 2)), owners


def _candidates(rng: np.random.Generator, points: NDArray, n: int) -> NDArray:
    """Where an adversary puts a replacement: on a summary point (k = 1 there), far from
    everything (k = 0), near the data."""
    return np.concatenate([points, [[FAR, FAR]], rng.normal(size=(n, 2)) * 1.5])


# ------------------------------------------------------------------ (i) one validation point
def test_a_replaced_validation_point_moves_the_values_by_at_most_2_over_m() -> None:
    """Five random summaries, 60 adversarial neighbours each (a validation point moved onto a
    summary point, far from everything or near the data): the L1 change of all owners' values
    never exceeds 2 / m."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(5):
        p, m = int(rng.integers(5, 25)), int(rng.integers(3, 12))
        points, ids, validation, owners = _random_case(rng, p, m)
        base = _values(points, ids, validation, owners)
        bound = payout_sensitivity(m, p, reveals_other_values=False).validation
        candidates = _candidates(rng, points, 10)
        for _ in range(60):
            neighbour = validation.copy()
            neighbour[rng.integers(m)] = candidates[rng.integers(len(candidates))]
            change = np.abs(_values(points, ids, neighbour, owners) - base).sum()
            worst = max(worst, change / bound)
    assert worst <= 1.0 + 1e-12


def test_the_validation_bound_is_attained() -> None:
    """Control: the bound is tight, so the test above could fail. Every summary point at one
    place, a validation point far from it moved onto it: every kernel value rises by 1."""
    p, m = 12, 5
    points = np.zeros((p, 2))
    ids = ["o0"] * 5 + ["o1"] * 7
    validation = np.full((m, 2), FAR)
    neighbour = validation.copy()
    neighbour[0] = 0.0
    owners = ("o0", "o1")
    change = np.abs(
        _values(points, ids, neighbour, owners) - _values(points, ids, validation, owners)
    ).sum()
    assert change == pytest.approx(2.0 / m, rel=1e-9)


# ------------------------------------------------------------------ (ii) one delivered point
def _owner_changes(points, ids, validation, owners, i, x):
    """(L1 change of the other owners' values, L1 change of all) when point i becomes x."""
    base = _values(points, ids, validation, owners)
    moved = points.copy()
    moved[i] = x
    delta = np.abs(_values(moved, ids, validation, owners) - base)
    j = owners.index(ids[i])
    return delta.sum() - delta[j], delta.sum()


def test_a_replaced_delivered_point_moves_the_other_owners_values_within_the_bound() -> None:
    """Five random summaries, 60 adversarial neighbours each (a delivered point moved onto
    another, onto a validation point, far from everything or near the data): the L1 change of
    the other owners' values stays within (p - 1) / p^2, and of all values within
    2 / p + 2 (p - 1) / p^2."""
    rng = np.random.default_rng(1)
    worst_others = worst_all = 0.0
    for _ in range(5):
        p, m = int(rng.integers(4, 20)), int(rng.integers(3, 10))
        points, ids, validation, owners = _random_case(rng, p, m)
        others = payout_sensitivity(m, p, reveals_other_values=False).owner
        everyone = payout_sensitivity(m, p, reveals_other_values=True).owner
        candidates = np.concatenate([_candidates(rng, points, 8), validation])
        for _ in range(60):
            i, x = rng.integers(p), candidates[rng.integers(len(candidates))]
            d_others, d_all = _owner_changes(points, ids, validation, owners, i, x)
            worst_others = max(worst_others, d_others / others)
            worst_all = max(worst_all, d_all / everyone)
    assert worst_others <= 1.0 + 1e-12
    assert worst_all <= 1.0 + 1e-12


def test_the_owner_bound_is_attained() -> None:
    """Control: every other point at one place; owner o0's one point far from it moved onto it."""
    p = 10
    points = np.zeros((p, 2))
    points[0] = FAR
    ids = ["o0"] + ["o1"] * 4 + ["o2"] * 5
    owners = ("o0", "o1", "o2")
    validation = np.full((3, 2), -FAR)
    d_others, _ = _owner_changes(points, ids, validation, owners, 0, np.zeros(2))
    assert d_others == pytest.approx((p - 1) / p**2, rel=1e-9)


def test_the_papers_game_has_no_such_bound() -> None:
    """Control for the choice of game: the Shapley values of v(C) = J(S_C) move the other
    owners' values by far more than (p - 1) / p^2 when one delivered point of a one-point owner
    is replaced (a lone point is judged as a one-point summary)."""
    p = 10
    points = np.zeros((p, 2))
    points[0] = FAR
    ids = ["o0"] + ["o1"] * 4 + ["o2"] * 5
    owners = ("o0", "o1", "o2")
    validation = np.zeros((3, 2))

    def others(pts: NDArray) -> NDArray:
        blocks = SummaryBlocks.from_summary(pts, ids, validation, GAMMA, owners=owners)
        return exact_shapley(ObjectiveGame(blocks)).values[1:]

    moved = points.copy()
    moved[0] = 0.0
    change = np.abs(others(moved) - others(points)).sum()
    assert change > 5 * (p - 1) / p**2


# ------------------------------------------------------------------ the release
def _worst_owner_pair():
    """The attained worst case of the owner relation: (blocks, neighbouring blocks)."""
    p = 10
    points = np.zeros((p, 2))
    points[0] = FAR
    ids = ["o0"] + ["o1"] * 4 + ["o2"] * 5
    owners = ("o0", "o1", "o2", "o3")  # o3 delivers nothing
    validation = np.full((100, 2), -FAR)  # m = 100: the owner bound sets the noise
    moved = points.copy()
    moved[0] = 0.0
    return (
        SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=owners),
        SummaryBlocks.from_summary(moved, ids, validation, GAMMA, owners=owners),
    )


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_the_privacy_loss_of_the_release_stays_within_epsilon(epsilon: float) -> None:
    """For the worst neighbouring owner tables, the log-likelihood ratio of what the owners other
    than o0 see (their noisy values under ValueReward) is at most epsilon for every output
    drawn; halving the noise (the control) exceeds it."""
    blocks, neighbour = _worst_owner_pair()
    rule = ValueReward(10**6)
    noise = SeededNoise(np.random.default_rng(2))
    a = embedding_shapley(blocks).values[1:3]
    b = embedding_shapley(neighbour).values[1:3]
    draws = np.array(
        [release_payouts(blocks, epsilon, rule, noise).values[1:3] for _ in range(2000)]
    )
    scale = release_payouts(blocks, epsilon, rule, noise).noise_scale

    def loss(s: float) -> NDArray:
        return (np.abs(draws - b).sum(axis=1) - np.abs(draws - a).sum(axis=1)) / s

    assert np.abs(loss(scale)).max() <= epsilon * (1 + 1e-9)
    assert np.abs(loss(scale / 2)).max() > epsilon


def test_the_release_adds_laplace_noise_at_the_calibrated_scale() -> None:
    """Kolmogorov-Smirnov against Laplace(0, b) of (released - exact) / b (p > 1e-4); owners
    with no delivered point receive exactly 0."""
    blocks, _ = _worst_owner_pair()
    exact = embedding_shapley(blocks).values
    noise = SeededNoise(np.random.default_rng(3))
    rel = [release_payouts(blocks, 1.0, ValueReward(0), noise) for _ in range(1500)]
    scale = rel[0].noise_scale
    sens = payout_sensitivity(blocks.m, blocks.p, reveals_other_values=False)
    assert scale == pytest.approx(max(sens.validation, sens.owner) / 1.0)
    residuals = np.concatenate([(r.values[:3] - exact[:3]) / scale for r in rel])
    assert stats.kstest(residuals, stats.laplace.cdf).pvalue > 1e-4
    assert all(r.values[3] == 0.0 for r in rel)


def test_the_release_charges_its_subjects_at_most_epsilon() -> None:
    blocks, _ = _worst_owner_pair()
    for rule in (ValueReward(1), ProportionalSplit(1)):
        release = release_payouts(blocks, 0.7, rule, SeededNoise(np.random.default_rng(4)))
        assert release.epsilon_validation <= 0.7 + 1e-12
        assert release.epsilon_owner <= 0.7 + 1e-12
        assert max(release.epsilon_validation, release.epsilon_owner) == pytest.approx(0.7)
        assert release.charged_owners == ("o0", "o1", "o2")
        assert release.owner_epsilon("o3") == 0.0
        events = release.privacy_events()
        assert events["validation"][0].epsilon == pytest.approx(release.epsilon_validation)
        assert events["owners"][0].epsilon == pytest.approx(release.epsilon_owner)
    # The proportional split shows every value to every owner: a larger owner sensitivity.
    assert (
        payout_sensitivity(3, 10, reveals_other_values=True).owner
        > payout_sensitivity(3, 10, reveals_other_values=False).owner
    )


def test_the_release_refuses_a_bad_epsilon() -> None:
    blocks, _ = _worst_owner_pair()
    with pytest.raises(ValueError, match="payout epsilon"):
        release_payouts(blocks, 0.0, ValueReward(1), SeededNoise(np.random.default_rng(0)))


# ------------------------------------------------------------------ reward rules
def test_value_reward_pays_each_owner_within_its_cap() -> None:
    """Without noise the estimate is the value itself, paid within [0, n_j / p]."""
    rule = ValueReward(1_000_000)
    # shares in nano-value; p = 10: the caps are n_j / p.
    pays = rule.payouts([250_000_000, -5, 900_000_000, 0], [5, 2, 3, 0], 10, 0)
    assert pays == (250_000, 0, 300_000, 0)
    assert sum(pays) <= rule.max_total()


def test_value_reward_shrinks_a_noisy_value_towards_its_points_prior() -> None:
    """The weight on the noisy value is tau^2 w^2 / (tau^2 w^2 + 2 b^2): all of it without noise,
    none with tau = 0 (pay by points: mu per point), and more for an owner with more points."""
    mu, tau, b = 300_000_000, 100_000_000, 50_000_000  # nano-value
    rule = ValueReward(10**6, mu, tau)
    share = 50_000_000  # 0.05 of J
    w = Fraction(4, 20)
    weight = (Fraction(tau, 10**9) * w) ** 2 / (
        (Fraction(tau, 10**9) * w) ** 2 + 2 * Fraction(b, 10**9) ** 2
    )
    expected = w * Fraction(mu, 10**9) + weight * (Fraction(share, 10**9) - w * Fraction(mu, 10**9))
    assert rule.estimate(share, 4, 20, b) == expected
    assert rule.payout(share, 4, 20, b) == int(10**6 * expected)  # floor of a positive value
    assert ValueReward(10**6, mu, 0).payout(share, 4, 20, b) == 10**6 * 4 * 3 // 200
    assert rule.estimate(share, 4, 20, 0) == Fraction(share, 10**9)
    # Monotone in the noisy value for a given count.
    pays = [rule.payout(s, 4, 20, b) for s in range(-(10**8), 3 * 10**8, 10**7)]
    assert pays == sorted(pays)
    with pytest.raises(ValueError, match="count"):
        rule.payout(share, 21, 20, b)


@settings(max_examples=200, deadline=None)
@given(
    reward=st.integers(0, 10**12),
    shares=st.lists(st.integers(-(10**9), 10**9), min_size=1, max_size=20),
    data=st.data(),
)
def test_payouts_are_non_negative_and_exact(reward: int, shares: list[int], data) -> None:
    counts = data.draw(st.lists(st.integers(0, 30), min_size=len(shares), max_size=len(shares)))
    if sum(counts) == 0:
        counts[0] = 1
    p = sum(counts)
    split = ProportionalSplit(reward).payouts(shares, counts, p)
    assert sum(split) == reward and min(split) >= 0
    assert all(
        pay == 0
        for pay, s, n in zip(split, shares, counts, strict=True)
        if s <= 0 and any(x > 0 for x in shares)
    )
    value = ValueReward(reward).payouts(shares, counts, p, 10**7)
    assert min(value) >= 0 and sum(value) <= reward


def test_reward_rules_refuse_money_as_floats() -> None:
    with pytest.raises(ValueError, match="micro-credits"):
        ValueReward(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sum to p"):
        ProportionalSplit(10).payouts([1, 2], [1, 1], 3)
    with pytest.raises(ValueError, match="nano-value"):
        ValueReward(10, point_spread=-1)
