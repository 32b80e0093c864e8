"""Value attribution against brute-force references: efficiency, symmetry, null owner, each rule
on small cases where every permutation of the owners can be walked."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
import pytest
from numpy.typing import NDArray

from dpmarket.common.market.attribution import (
    MAX_EXACT_OWNERS,
    Attribution,
    EmbeddingGame,
    ObjectiveGame,
    SummaryBlocks,
    SummaryGame,
    embedding_shapley,
    exact_shapley,
    leave_one_out,
    own_shapley,
    own_weights,
    paper_rule,
    sampled_shapley,
)
from dpmarket.common.summarization.kernels import objective_j, rbf_kernel

GAMMA = 0.4
OWNERS = ("a", "b", "c", "d", "e")


def _case(seed: int, p: int = 14, m: int = 9, k: int = 4) -> tuple[NDArray, list[str], NDArray]:
    """A summary of p points from the first k - 1 owners of OWNERS (the k-th delivers none)."""
    rng = np.random.default_rng(seed)
    points = rng.normal(size=(p, 3))
    validation = rng.normal(size=(m, 3)) + 0.5
    ids = [OWNERS[i] for i in rng.integers(0, k - 1, size=p)]
    return points, ids, validation


def _objective(points: NDArray, ids: list[str], validation: NDArray) -> Callable[[set[str]], float]:
    """J of a coalition's points, straight from the kernel matrix (J(empty) = 0)."""

    def value(coalition: set[str]) -> float:
        idx = [i for i, o in enumerate(ids) if o in coalition]
        return 0.0 if not idx else objective_j(points[idx], validation, GAMMA)

    return value


def _embedding(points: NDArray, ids: list[str], validation: NDArray) -> Callable[[set[str]], float]:
    """e(C) = 2 <mu_V, mu_C> - ||mu_C||^2 with mu_C the coalition's points at weight 1 / p."""
    p, m = points.shape[0], validation.shape[0]
    kv = rbf_kernel(validation, points, GAMMA).sum(axis=0)
    kss = rbf_kernel(points, points, GAMMA)

    def value(coalition: set[str]) -> float:
        idx = [i for i, o in enumerate(ids) if o in coalition]
        return 2.0 * kv[idx].sum() / (m * p) - kss[np.ix_(idx, idx)].sum() / p**2

    return value


def _brute_shapley(value: Callable[[set[str]], float], owners: tuple[str, ...]) -> NDArray:
    """Shapley values as the mean marginal contribution over all K! orders."""
    phi = np.zeros(len(owners))
    perms = list(itertools.permutations(range(len(owners))))
    for perm in perms:
        coalition: set[str] = set()
        for j in perm:
            before = value(coalition)
            coalition.add(owners[j])
            phi[j] += value(coalition) - before
    return phi / len(perms)


def _blocks(points: NDArray, ids: list[str], validation: NDArray, k: int = 4) -> SummaryBlocks:
    return SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=OWNERS[:k])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coalition_values_are_the_objective_of_the_coalitions_points(seed: int) -> None:
    points, ids, validation = _case(seed)
    blocks = _blocks(points, ids, validation)
    masks = np.array(list(itertools.product([0, 1], repeat=4)))
    for game, reference in (
        (ObjectiveGame(blocks), _objective(points, ids, validation)),
        (EmbeddingGame(blocks), _embedding(points, ids, validation)),
    ):
        expected = [reference({OWNERS[j] for j in range(4) if row[j]}) for row in masks]
        np.testing.assert_allclose(game.values(masks), expected, atol=1e-12)


def test_blocks_are_independent_of_the_chunk_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel pass in blocks of rows gives the blocks of one dense pass."""
    import dpmarket.common.market.attribution as attribution

    points, ids, validation = _case(3, p=23, m=11)
    whole = _blocks(points, ids, validation)
    monkeypatch.setattr(attribution, "_CHUNK", 5)
    chunked = _blocks(points, ids, validation)
    for name in ("cross", "within", "point_cross", "point_prior"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(whole, name), atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_shapley_is_the_brute_force_mean_over_orders(seed: int) -> None:
    points, ids, validation = _case(seed)
    blocks = _blocks(points, ids, validation)
    for game, reference in (
        (ObjectiveGame(blocks), _objective(points, ids, validation)),
        (EmbeddingGame(blocks), _embedding(points, ids, validation)),
    ):
        expected = _brute_shapley(reference, OWNERS[:4])
        np.testing.assert_allclose(exact_shapley(game).values, expected, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_embedding_games_closed_form_is_its_shapley_value(seed: int) -> None:
    blocks = _blocks(*_case(seed))
    np.testing.assert_allclose(
        embedding_shapley(blocks).values, exact_shapley(EmbeddingGame(blocks)).values, atol=1e-13
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_paper_rule_is_each_owners_sum_of_marginal_gains_in_order(seed: int) -> None:
    points, ids, validation = _case(seed)
    expected = np.zeros(4)
    previous = 0.0
    for i in range(points.shape[0]):
        current = objective_j(points[: i + 1], validation, GAMMA)
        expected[OWNERS.index(ids[i])] += current - previous
        previous = current
    got = paper_rule(ObjectiveGame(_blocks(points, ids, validation)))
    np.testing.assert_allclose(got.values, expected, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_leave_one_out_is_the_grand_value_less_the_others(seed: int) -> None:
    points, ids, validation = _case(seed)
    value = _objective(points, ids, validation)
    everyone = set(OWNERS[:4])
    expected = [value(everyone) - value(everyone - {o}) for o in OWNERS[:4]]
    got = leave_one_out(ObjectiveGame(_blocks(points, ids, validation)))
    np.testing.assert_allclose(got.values, expected, atol=1e-12)


def _rules(game: SummaryGame) -> list[Attribution]:
    return [
        paper_rule(game),
        exact_shapley(game),
        sampled_shapley(game, 64, np.random.default_rng(0)),
        leave_one_out(game),
    ]


@pytest.mark.parametrize("game_type", [ObjectiveGame, EmbeddingGame])
def test_efficiency_every_rule_but_leave_one_out_sums_to_the_grand_value(
    game_type: type[SummaryGame],
) -> None:
    points, ids, validation = _case(4)
    game = game_type(_blocks(points, ids, validation))
    reference = (_objective if game_type is ObjectiveGame else _embedding)(points, ids, validation)
    grand = reference(set(OWNERS[:4]))
    assert grand == pytest.approx(objective_j(points, validation, GAMMA), abs=1e-12)
    for result in _rules(game):
        assert result.total == pytest.approx(grand, abs=1e-12)
        if result.rule != "leave-one-out":
            assert result.values.sum() == pytest.approx(grand, abs=1e-12), result.rule
    # Control: leave-one-out does not sum to the grand value here.
    assert abs(leave_one_out(game).values.sum() - grand) > 1e-3


@pytest.mark.parametrize("game_type", [ObjectiveGame, EmbeddingGame])
def test_null_owner_one_with_no_delivered_point_gets_zero(game_type: type[SummaryGame]) -> None:
    points, ids, validation = _case(5, k=5)  # owner "e" delivers nothing
    game = game_type(_blocks(points, ids, validation, k=5))
    assert game.blocks.counts[4] == 0
    for result in _rules(game):
        assert result.values[4] == 0.0, result.rule
    assert embedding_shapley(game.blocks).values[4] == 0.0


@pytest.mark.parametrize("game_type", [ObjectiveGame, EmbeddingGame])
def test_symmetry_identical_owners_get_equal_shapley_values(game_type: type[SummaryGame]) -> None:
    """Owners b and c deliver the same points: Shapley and leave-one-out treat them alike, the
    paper's rule (order-dependent) does not."""
    rng = np.random.default_rng(6)
    base = rng.normal(size=(4, 3))
    other = rng.normal(size=(5, 3))
    points = np.concatenate([base, other[:2], base, other[2:]])
    ids = ["b"] * 4 + ["a"] * 2 + ["c"] * 4 + ["a"] * 3
    validation = rng.normal(size=(8, 3))
    game = game_type(
        SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=("a", "b", "c"))
    )
    reference = (_objective if game_type is ObjectiveGame else _embedding)(points, ids, validation)
    brute = _brute_shapley(reference, ("a", "b", "c"))
    assert brute[1] == pytest.approx(brute[2], abs=1e-12)
    for result in (exact_shapley(game), leave_one_out(game)):
        assert result.values[1] == pytest.approx(result.values[2], abs=1e-12), result.rule
    np.testing.assert_allclose(exact_shapley(game).values, brute, atol=1e-12)
    paper = paper_rule(game).values
    assert abs(paper[1] - paper[2]) > 1e-3  # control: the paper's rule is not symmetric


def test_sampled_shapley_is_within_its_standard_errors_of_the_exact_values() -> None:
    """K = 7 owners; each estimate within 5 standard errors of the exact value (a false failure
    has probability below 1e-5 per owner for a normal estimate of 200 pairs)."""
    rng = np.random.default_rng(7)
    points = rng.normal(size=(40, 3))
    ids = [f"o{i}" for i in rng.integers(0, 7, size=40)]
    blocks = SummaryBlocks.from_summary(
        points, ids, rng.normal(size=(10, 3)), GAMMA, owners=[f"o{i}" for i in range(7)]
    )
    game = ObjectiveGame(blocks)
    exact = exact_shapley(game).values
    for antithetic in (True, False):
        est = sampled_shapley(game, 400, np.random.default_rng(8), antithetic=antithetic)
        assert est.standard_errors is not None and est.n_permutations == 400
        assert np.all(np.abs(est.values - exact) <= 5 * est.standard_errors + 1e-12)
        assert np.all(est.standard_errors > 0)


def test_antithetic_pairs_reduce_the_standard_error() -> None:
    rng = np.random.default_rng(9)
    points = rng.normal(size=(60, 3))
    ids = [f"o{i}" for i in rng.integers(0, 12, size=60)]
    game = ObjectiveGame(SummaryBlocks.from_summary(points, ids, rng.normal(size=(10, 3)), GAMMA))
    paired = sampled_shapley(game, 2000, np.random.default_rng(1), antithetic=True)
    plain = sampled_shapley(game, 2000, np.random.default_rng(1), antithetic=False)
    assert paired.standard_errors is not None and plain.standard_errors is not None
    assert paired.standard_errors.mean() < plain.standard_errors.mean()


def test_exact_shapley_refuses_more_owners_than_it_enumerates() -> None:
    k = MAX_EXACT_OWNERS + 1
    points = np.arange(k, dtype=float)[:, None]
    blocks = SummaryBlocks.from_summary(points, [f"o{i}" for i in range(k)], points, GAMMA)
    with pytest.raises(ValueError, match="use sampled_shapley"):
        exact_shapley(ObjectiveGame(blocks))
    assert sampled_shapley(ObjectiveGame(blocks), 4, np.random.default_rng(0)).values.shape == (k,)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"owner_ids": ["a"]}, "one entry per point|owner of each"),
        ({"owners": ["a"]}, "not in owners"),
        ({"owners": ["a", "b", "c", "a"]}, "repeat"),
        ({"gamma": 0.0}, "gamma"),
    ],
)
def test_bad_inputs_are_refused_naming_the_value(kwargs: dict, message: str) -> None:
    points, ids, validation = _case(0)
    args = {"owner_ids": ids, "gamma": GAMMA, "owners": None} | kwargs
    with pytest.raises(ValueError, match=message):
        SummaryBlocks.from_summary(
            points, args["owner_ids"], validation, args["gamma"], owners=args["owners"]
        )


def test_sampled_shapley_needs_two_permutations() -> None:
    game = ObjectiveGame(_blocks(*_case(0)))
    with pytest.raises(ValueError, match="n_permutations"):
        sampled_shapley(game, 1, np.random.default_rng(0))
    assert math.isfinite(game.grand_value())


# ------------------------------------------------------------------ the own-data part
def _brute_own(points: NDArray, ids: list[str], validation: NDArray, owners: tuple[str, ...]):
    """psi_j as the mean over all K! orders of j's own-data marginal contribution: its own
    closeness and redundancy at the weight of the coalition it joins, and the diagonal term."""
    m = validation.shape[0]
    kv = rbf_kernel(validation, points, GAMMA).sum(axis=0)
    kss = rbf_kernel(points, points, GAMMA)
    idx = {o: [i for i, x in enumerate(ids) if x == o] for o in owners}
    psi = np.zeros(len(owners))
    perms = list(itertools.permutations(range(len(owners))))
    for perm in perms:
        before = 0
        for j in perm:
            own = idx[owners[j]]
            n = len(own)
            if n:
                big = before + n
                redundancy = kss[np.ix_(own, own)].sum() - n
                diagonal = (1.0 / before if before else 0.0) - 1.0 / big
                psi[j] += 2.0 * kv[own].sum() / (m * big) - redundancy / big**2 + diagonal
            before += n
    return psi / len(perms)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_own_shapley_is_the_brute_force_mean_of_the_own_terms_over_orders(seed: int) -> None:
    points, ids, validation = _case(seed, k=5)
    got = own_shapley(_blocks(points, ids, validation, k=5))
    np.testing.assert_allclose(got.values, _brute_own(points, ids, validation, OWNERS), atol=1e-12)
    assert got.values[4] == 0.0  # null owner: exactly 0
    assert got.rule == "shapley-own" and got.game == "objective"


def test_own_weights_are_the_moments_of_the_coalition_size_over_orders() -> None:
    counts = np.array([3, 1, 0, 2, 5])
    inverse, square, term = np.zeros(5), np.zeros(5), np.zeros(5)
    perms = list(itertools.permutations(range(5)))
    for perm in perms:
        before = 0
        for j in perm:
            if counts[j]:
                big = before + counts[j]
                inverse[j] += 1 / big
                square[j] += 1 / big**2
                term[j] += (1 / before if before else 0.0) - 1 / big
            before += counts[j]
    w = own_weights(counts)
    for got, want in ((w.inverse, inverse), (w.inverse_square, square), (w.count_term, term)):
        np.testing.assert_allclose(got, want / len(perms), atol=1e-14)
    with pytest.raises(ValueError, match="integers >= 0"):
        own_weights(np.array([1, -1]))


def test_own_shapley_of_a_lone_owner_is_the_summarys_objective_and_symmetric_owners_tie() -> None:
    points, _, validation = _case(4, p=9, k=2)
    lone = own_shapley(_blocks(points, ["a"] * 9, validation))
    assert lone.values[0] == pytest.approx(objective_j(points, validation, GAMMA), abs=1e-12)
    assert lone.values[0] == pytest.approx(lone.total, abs=1e-12)
    # Owners a and b hold the same points (b's a copy of a's); c holds others.
    twin = np.concatenate([points[:4], points[:4], points[4:]])
    ids = ["a"] * 4 + ["b"] * 4 + ["c"] * 5
    values = own_shapley(_blocks(twin, ids, validation)).values
    assert values[0] == pytest.approx(values[1], abs=1e-13) and values[3] == 0.0
