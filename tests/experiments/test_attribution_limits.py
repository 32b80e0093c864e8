"""experiments/attribution_limits.py: the closeness map, the sensitivities, the bound on every
DP mechanism and the neighbour search, each against a recomputation from the points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.optimize import linprog

from dpmarket.common.market import ObjectiveGame, SummaryBlocks, exact_shapley
from dpmarket.experiments.attribution import spearman
from dpmarket.experiments.attribution_limits import (
    closeness_map,
    dp_rank_bound,
    flip_search,
    oracle_spearman,
    owner_sensitivity,
    owner_sums,
    validation_sensitivity,
)

GAMMA = 0.5


def _phi(points, ids, validation, owners):
    blocks = SummaryBlocks.from_summary(points, ids, validation, GAMMA, owners=owners)
    return blocks, exact_shapley(ObjectiveGame(blocks)).values


def _example(seed: int = 0):
    rng = np.random.default_rng(seed)
    owners = ("a", "b", "c", "d", "e")
    ids = [owners[i] for i in rng.integers(0, 4, size=14)]  # "e" delivers nothing
    points = rng.normal(size=(14, 3))
    validation = rng.normal(size=(9, 3))
    return points, ids, validation, owners


def test_the_closeness_map_moves_the_values_as_a_replaced_validation_point_does() -> None:
    points, ids, validation, owners = _example()
    blocks, phi = _phi(points, ids, validation, owners)
    w = closeness_map(blocks)
    assert np.all(w[4] == 0) and np.all(w[:, 4] == 0)  # the null owner
    sums = owner_sums(validation, points, blocks.point_owner, 5, GAMMA)
    for r, new in ((0, points[3]), (5, validation[2] + 0.3)):
        moved = validation.copy()
        moved[r] = new
        _, expected = _phi(points, ids, moved, owners)
        delta = owner_sums(new[None], points, blocks.point_owner, 5, GAMMA)[0] - sums[r]
        assert phi + 2.0 / blocks.m * w @ delta == pytest.approx(expected, abs=1e-12)
        assert np.abs(expected - phi).sum() <= validation_sensitivity(blocks, w) + 1e-12


def test_the_validation_sensitivity_is_reached_by_owners_placed_at_two_spots() -> None:
    # The owners of the sign vector's +1 at one spot, the others at a far one: v at the far
    # spot, v' at the near one, and the values move by the bound (up to the kernel's tail).
    counts = [3, 1, 2, 4]
    ids = [o for o, c in zip("abcd", counts, strict=True) for _ in range(c)]
    blocks, _ = _phi(
        np.zeros((10, 2)),
        ids,
        np.zeros((5, 2)),
        tuple("abcd"),
    )
    w = closeness_map(blocks)
    bound = validation_sensitivity(blocks, w)
    best = 0.0
    for signs in range(16):
        plus = [(signs >> j) & 1 for j in range(4)]
        where = {o: np.zeros(2) if plus[j] else np.array([50.0, 0.0]) for j, o in enumerate("abcd")}
        points = np.array([where[o] for o in ids])
        validation = np.tile([[0.0, 30.0]], (5, 1))
        validation[0] = [50.0, 0.0]
        _, before = _phi(points, ids, validation, tuple("abcd"))
        validation[0] = [0.0, 0.0]
        _, after = _phi(points, ids, validation, tuple("abcd"))
        best = max(best, float(np.abs(after - before).sum()))
    assert best == pytest.approx(bound, rel=1e-9)


def test_the_owner_sensitivity_is_reached_by_one_point_moved_onto_the_validation_set() -> None:
    owners = tuple("abc")
    ids = ["a", "a", "b", "c", "c", "c"]
    points = np.array(
        [[0.0, 40.0], [0.0, 80.0], [40.0, 0.0], [80.0, 0.0], [120.0, 0.0], [0, -40.0]]
    )
    validation = np.zeros((4, 2))
    blocks, before = _phi(points, ids, validation, owners)
    w = closeness_map(blocks)
    moved = points.copy()
    moved[2] = [0.0, 0.0]  # owner b's only point onto the validation set
    _, after = _phi(moved, ids, validation, owners)
    others = np.abs(np.delete(after - before, 1)).sum()
    assert others == pytest.approx(2.0 * np.abs(np.delete(w[:, 1], 1)).sum(), rel=1e-9)
    assert others <= owner_sensitivity(blocks, w) + 1e-12


def _arc_lp(t: float, rho: float, grid: int = 401) -> float:
    """max min(E_P a, E_Q b) over distributions P, Q on the arc, P <= e^t Q and Q <= e^t P."""
    theta0 = math.acos(rho)
    theta = np.linspace(0.0, theta0, grid)
    a, b = np.cos(theta), np.cos(theta0 - theta)
    n = theta.size  # variables: P (n), Q (n), s
    c = np.zeros(2 * n + 1)
    c[-1] = -1.0
    rows, rhs = [], []
    for i in range(n):
        for sign in (1, -1):
            row = np.zeros(2 * n + 1)
            row[i], row[n + i] = (1.0, -math.exp(t)) if sign == 1 else (-math.exp(t), 1.0)
            rows.append(row)
            rhs.append(0.0)
    for coef, off in ((a, 0), (b, n)):
        row = np.zeros(2 * n + 1)
        row[off : off + n] = -coef
        row[-1] = 1.0
        rows.append(row)
        rhs.append(0.0)
    eq = np.zeros((2, 2 * n + 1))
    eq[0, :n], eq[1, n : 2 * n] = 1.0, 1.0
    res = linprog(
        c,
        A_ub=np.array(rows),
        b_ub=rhs,
        A_eq=eq,
        b_eq=[1.0, 1.0],
        bounds=[(0, None)] * (2 * n) + [(None, None)],
    )
    return float(-res.fun)


@pytest.mark.parametrize(("t", "rho"), [(1.0, 0.3), (1.0, 0.9), (2.0, -0.5), (0.2, 0.0)])
def test_the_dp_bound_is_the_best_pair_of_output_distributions(t: float, rho: float) -> None:
    lp = _arc_lp(t, rho)
    assert lp <= dp_rank_bound(t, rho) + 1e-9
    assert lp == pytest.approx(dp_rank_bound(t, rho), abs=1e-4)


def test_the_dp_bound_at_its_ends() -> None:
    assert dp_rank_bound(0.0, 0.2) == pytest.approx(math.sqrt(0.6))
    assert dp_rank_bound(1000.0, -1.0) == pytest.approx(1.0)
    assert dp_rank_bound(1.0, 0.517) == pytest.approx(0.9, abs=1e-3)
    assert dp_rank_bound(3.0, -1.0) > 0.9  # three points apart, nothing is excluded


def test_the_neighbour_search_reports_what_a_recomputation_finds() -> None:
    points, ids, validation, owners = _example(1)
    blocks, phi = _phi(points, ids, validation, owners)
    w = closeness_map(blocks)
    sums = owner_sums(validation, points, blocks.point_owner, 5, GAMMA)
    cand = np.concatenate([points, validation])
    cand_sums = owner_sums(cand, points, blocks.point_owner, 5, GAMMA)
    flip = flip_search(phi, w, blocks.m, sums, cand_sums)
    moved = validation.copy()
    for (r, c), rho in zip(flip.moves, flip.rho, strict=True):
        moved[r] = cand[c]
        _, after = _phi(points, ids, moved, owners)
        assert spearman(after, phi) == pytest.approx(rho)
    assert flip.rho[0] < 1.0  # something moved the ranking here
    assert flip.bound(1.0) == min(dp_rank_bound(k, r) for k, r in enumerate(flip.rho, start=1))


def test_the_oracle_ranks_exactly_without_noise_and_keeps_null_owners_at_zero() -> None:
    phi = np.array([0.3, 0.0, 0.1, 0.2])
    active = np.array([True, False, True, True])
    rng = np.random.default_rng(0)
    assert oracle_spearman(phi, active, 1e-9, 20, rng) == pytest.approx(1.0)
    assert oracle_spearman(phi, active, 10.0, 400, rng) < 0.5  # noise far above the gaps
