"""The own-data payout release: its derived sensitivities hold against adversarial neighbouring
validation sets and owner tables, each with a control that attains or breaks them, and its
privacy loss stays within epsilon."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.market.attribution import (
    ObjectiveGame,
    SummaryBlocks,
    exact_shapley,
    own_shapley,
)
from dpmarket.common.market.payouts import (
    ProportionalSplit,
    ValueReward,
    own_payout_sensitivity,
    release_own_payouts,
)
from dpmarket.common.privacy.noise import SeededNoise

GAMMA = 1.0
FAR = 50.0  # k = exp(-GAMMA * FAR^2) is 0 to double precision


def _values(
    points: NDArray, ids: list[str], validation: NDArray, owners: tuple[str, ...]
) -> NDArray:
    blocks = SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=owners)
    return own_shapley(blocks).values


def _random_case(rng: np.random.Generator, p: int, m: int, k: int = 4):
    points = rng.normal(size=(p, 2))
    ids = [f"o{i}" for i in rng.integers(0, k, size=p)]
    owners = tuple(f"o{i}" for i in range(k))
    return points, ids, rng.normal(size=(m, 2)), owners


def _counts(ids: list[str], owners: tuple[str, ...]) -> NDArray:
    return np.array([ids.count(o) for o in owners])


def _candidates(rng: np.random.Generator, points: NDArray, n: int) -> NDArray:
    """Where an adversary puts a replacement: on a summary point, far from everything, near the
    data."""
    return np.concatenate([points, [[FAR, FAR]], rng.normal(size=(n, 2)) * 1.5])


# ------------------------------------------------------------------ (i) one validation point
def test_a_replaced_validation_point_moves_the_own_values_within_the_derived_bound() -> None:
    """Five random summaries, 60 adversarial neighbours each: the L1 change of all owners'
    values never exceeds (2 / m) sum_j n_j E[1 / N_j]."""
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(5):
        p, m = int(rng.integers(5, 25)), int(rng.integers(3, 12))
        points, ids, validation, owners = _random_case(rng, p, m)
        base = _values(points, ids, validation, owners)
        bound = own_payout_sensitivity(
            _counts(ids, owners), m, reveals_other_values=False
        ).validation
        candidates = _candidates(rng, points, 10)
        for _ in range(60):
            neighbour = validation.copy()
            neighbour[rng.integers(m)] = candidates[rng.integers(len(candidates))]
            change = np.abs(_values(points, ids, neighbour, owners) - base).sum()
            worst = max(worst, change / bound)
    assert worst <= 1.0 + 1e-12


def _worst_validation_pair():
    """Every summary point at one place, a validation point far from it moved onto it: every
    kernel value k(v, x) rises by 1, the bound's worst case."""
    p, m = 12, 5
    points = np.zeros((p, 2))
    ids = ["o0"] * 5 + ["o1"] * 6 + ["o2"]
    owners = ("o0", "o1", "o2", "o3")  # o3 delivers nothing
    validation = np.full((m, 2), FAR)
    neighbour = validation.copy()
    neighbour[0] = 0.0
    return (
        SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=owners),
        SummaryBlocks.from_summary(points, ids, neighbour, GAMMA, owners=owners),
    )


def test_the_validation_bound_is_attained() -> None:
    """Control: the bound is tight, so the test above could fail."""
    blocks, neighbour = _worst_validation_pair()
    change = np.abs(own_shapley(neighbour).values - own_shapley(blocks).values).sum()
    bound = own_payout_sensitivity(blocks.counts, blocks.m, reveals_other_values=False)
    assert change == pytest.approx(bound.validation, rel=1e-9)
    # Larger than the embedding game's 2 / m: the price of ranking like the paper's game.
    assert bound.validation > 2.0 / blocks.m


# ------------------------------------------------------------------ (ii) one delivered point
def test_a_replaced_delivered_point_moves_no_other_owners_value() -> None:
    """Five random summaries, 60 adversarial neighbours each (a delivered point moved onto
    another, onto a validation point, far from everything or near the data): the other owners'
    values do not move at all (D_O = 0), and the owner's own value stays within the bound the
    proportional split needs."""
    rng = np.random.default_rng(1)
    worst_own = 0.0
    for _ in range(5):
        p, m = int(rng.integers(4, 20)), int(rng.integers(3, 10))
        points, ids, validation, owners = _random_case(rng, p, m)
        everyone = own_payout_sensitivity(_counts(ids, owners), m, reveals_other_values=True)
        base = _values(points, ids, validation, owners)
        candidates = np.concatenate([_candidates(rng, points, 8), validation])
        for _ in range(60):
            i, x = int(rng.integers(p)), candidates[rng.integers(len(candidates))]
            moved = points.copy()
            moved[i] = x
            delta = np.abs(_values(moved, ids, validation, owners) - base)
            j = owners.index(ids[i])
            assert delta.sum() - delta[j] <= 1e-15
            worst_own = max(worst_own, delta[j] / everyone.owner)
    assert worst_own <= 1.0 + 1e-12


def test_the_papers_game_moves_the_other_owners_where_the_own_values_do_not() -> None:
    """Control: the same neighbouring owner tables move the other owners' exact Shapley values
    of v(C) = J(S_C) by far more than 0 (a lone point is judged as a one-point summary)."""
    p = 10
    points = np.zeros((p, 2))
    points[0] = FAR
    ids = ["o0"] + ["o1"] * 4 + ["o2"] * 5
    owners = ("o0", "o1", "o2")
    validation = np.zeros((3, 2))
    moved = points.copy()
    moved[0] = 0.0

    def both(pts: NDArray) -> tuple[NDArray, NDArray]:
        blocks = SummaryBlocks.from_summary(pts, ids, validation, GAMMA, owners=owners)
        return own_shapley(blocks).values[1:], exact_shapley(ObjectiveGame(blocks)).values[1:]

    (own_a, exact_a), (own_b, exact_b) = both(points), both(moved)
    assert np.abs(own_b - own_a).sum() == 0.0
    assert np.abs(exact_b - exact_a).sum() > 0.1


# ------------------------------------------------------------------ the release
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_the_privacy_loss_of_the_own_release_stays_within_epsilon(epsilon: float) -> None:
    """For the worst neighbouring validation sets, the log-likelihood ratio of the released
    values is at most epsilon for every output drawn; halving the noise (the control) exceeds
    it."""
    blocks, neighbour = _worst_validation_pair()
    rule = ValueReward(10**6)
    noise = SeededNoise(np.random.default_rng(2))
    a = own_shapley(blocks).values[:3]
    b = own_shapley(neighbour).values[:3]
    releases = [release_own_payouts(blocks, epsilon, rule, noise) for _ in range(1000)]
    draws = np.array([r.values[:3] for r in releases])
    scale = releases[0].noise_scale

    def loss(s: float) -> NDArray:
        return (np.abs(draws - b).sum(axis=1) - np.abs(draws - a).sum(axis=1)) / s

    assert np.abs(loss(scale)).max() <= epsilon * (1 + 1e-9)
    assert np.abs(loss(scale / 2)).max() > epsilon
    assert all(r.values[3] == 0.0 for r in releases)  # no delivered point: exactly 0


def test_the_own_release_charges_the_validation_set_and_no_owner() -> None:
    blocks, _ = _worst_validation_pair()
    release = release_own_payouts(
        blocks, 0.7, ValueReward(1), SeededNoise(np.random.default_rng(4))
    )
    sens = own_payout_sensitivity(blocks.counts, blocks.m, reveals_other_values=False)
    assert release.noise_scale == pytest.approx(sens.validation / 0.7)
    assert release.epsilon_validation == pytest.approx(0.7)
    assert release.epsilon_owner == 0.0 and release.owner_epsilon("o0") == 0.0
    events = release.privacy_events()
    assert events["owners"] == [] and events["validation"][0].epsilon == pytest.approx(0.7)
    # The proportional split shows every value to every owner: owners are charged then.
    split = release_own_payouts(
        blocks, 0.7, ProportionalSplit(1), SeededNoise(np.random.default_rng(4))
    )
    assert split.sensitivity.owner > 0 and split.epsilon_owner <= 0.7 + 1e-12
    assert max(split.epsilon_owner, split.epsilon_validation) == pytest.approx(0.7)


def test_the_own_release_refuses_a_bad_epsilon_and_counts_without_a_point() -> None:
    blocks, _ = _worst_validation_pair()
    with pytest.raises(ValueError, match="payout epsilon"):
        release_own_payouts(blocks, 0.0, ValueReward(1), SeededNoise(np.random.default_rng(0)))
    with pytest.raises(ValueError, match="no point"):
        own_payout_sensitivity([0, 0], 5, reveals_other_values=False)
