"""Tests for the derived plan's adaptive selection: the closed-form Chow–Liu tree it scores
against (dpmarket.common.sketches.marginals_tree) and the release that uses it (one selection per
round, no fit at the owner, the budget spent exactly)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpmarket.common.privacy.accounting import exponential_zcdp_rho, gaussian_zcdp_rho, zcdp_rho
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.marginals import (
    AUTO,
    EVERY_PAIR_MAX_MODEL_MB,
    ONEWAY_SHARE,
    MarginalsMechanism,
    MarginalsModel,
    MarginalsSketch,
    Measurement,
    default_oneway_share,
    marginals_map,
    model_size_mb,
)
from dpmarket.common.sketches.marginals_tree import ChowLiuTree


def _chain(n: int, rng: np.random.Generator) -> np.ndarray:
    """Binary columns a, b, c, d, e: b is a with 5 % flipped and c is b with 5 % flipped (a
    Markov chain: every pair of a, b, c strongly dependent, (a, c) only through b); e is d with
    30 % flipped (a weaker pair, independent of the chain)."""
    a = rng.random(n) < 0.5
    b = a ^ (rng.random(n) < 0.05)
    c = b ^ (rng.random(n) < 0.05)
    d = rng.random(n) < 0.5
    e = d ^ (rng.random(n) < 0.3)
    return np.column_stack([a, b, c, d, e]).astype(float)


def _binary(d: int) -> Domain:
    return Domain(np.zeros(d), np.ones(d), levels=tuple(np.array([0.0, 1.0]) for _ in range(d)))


def _table(records: np.ndarray, clique: tuple[int, ...]) -> np.ndarray:
    codes = records[:, list(clique)].astype(int)
    flat = np.ravel_multi_index(tuple(codes.T), (2,) * len(clique))
    return np.bincount(flat, minlength=2 ** len(clique)).astype(float)


def test_the_tree_answers_a_chain_s_unmeasured_pair_where_independence_cannot() -> None:
    """With (a, b) and (b, c) measured exactly, the tree's (a, c) is the chain's
    P(a, b) P(c | b) summed over b, within sampling error of the truth; the product of the
    1-way marginals (what a one-round selection scores against: the control) misses it by
    ~0.8 n in L1. A measured pair on the tree is answered by its own table."""
    records = _chain(20_000, np.random.default_rng(0))
    n = records.shape[0]
    shares = [_table(records, (j,)) / n for j in range(5)]
    pairs = {(0, 1): _table(records, (0, 1)), (1, 2): _table(records, (1, 2))}
    tree = ChowLiuTree(shares, n, pairs)
    truth = _table(records, (0, 2)).reshape(2, 2)
    assert np.abs(tree.marginal((0, 2)) - truth).sum() < 0.02 * n
    independent = np.outer(shares[0], shares[2]) * n
    assert np.abs(independent - truth).sum() > 0.7 * n
    np.testing.assert_allclose(tree.marginal((0, 1)).reshape(-1), pairs[0, 1])
    np.testing.assert_allclose(tree.marginal((3, 4)), np.outer(shares[3], shares[4]) * n)
    assert tree.marginal((2,)).sum() == pytest.approx(n)
    with pytest.raises(ValueError, match="1- and 2-way"):
        tree.marginal((0, 1, 2))


def test_the_derived_plan_selects_adaptively_against_the_tree() -> None:
    """Three selections at a large epsilon on the chain: scored against the tree of the picks so
    far, the third is the weaker pair (d, e), because the chain's third pair is explained by its
    first two; one round of three against independence (rounds stated: 1, the control) measures
    the chain's three pairs and never (d, e)."""
    domain = _binary(5)
    records = _chain(4000, np.random.default_rng(1))
    for seed in range(3):
        derived = MarginalsMechanism(
            marginals_map(domain, 2, measurements=3), domain, 20.0, 1e-6
        ).release(records, rng=np.random.default_rng(seed))
        picked = {m.clique for m in derived.measurements[5:]}
        assert (3, 4) in picked and len(picked & {(0, 1), (0, 2), (1, 2)}) == 2
        one_round = MarginalsMechanism(
            marginals_map(domain, 2, rounds=1, measurements=3), domain, 20.0, 1e-6
        ).release(records, rng=np.random.default_rng(seed))
        assert {m.clique for m in one_round.measurements[5:]} == {(0, 1), (0, 2), (1, 2)}


def test_the_derived_plan_spends_exactly_rho_and_fits_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds not stated: K rounds of one selection each, whose selections and measurements
    add up to the release's rho exactly (zCDP composes adaptively by adding), each pair measured
    once, and no graphical model fitted at the owner (the fit is made to fail). Control: the
    same release with one more selection claimed, or one pick measured at half its sigma,
    spends more than rho and a receiver refuses it."""
    domain = _binary(5)
    mech = MarginalsMechanism(marginals_map(domain, 2, measurements=6), domain, 1.0, 1e-6)
    assert mech.feature_map.rounds == AUTO and mech.tree_scored
    plan = mech.plan()
    assert mech.rounds == len(plan) == 6 and all(p.selections == 1 for p in plan)
    spent = domain.n_attributes * gaussian_zcdp_rho(mech.oneway_sigma) + sum(
        exponential_zcdp_rho(p.epsilon) + gaussian_zcdp_rho(p.sigma) for p in plan
    )
    assert spent == pytest.approx(zcdp_rho(1.0, 1e-6), rel=1e-12)
    # The same per-measurement noise as one round of six: adaptivity is not paid in noise.
    one_round = MarginalsMechanism(
        marginals_map(domain, 2, rounds=1, measurements=6),
        domain,
        1.0,
        1e-6,
        oneway_share=mech.oneway_share,
    )
    assert plan[0].sigma == pytest.approx(one_round.plan()[0].sigma, rel=1e-12)

    def no_fit(*args: object, **kwargs: object) -> MarginalsModel:
        raise AssertionError("the derived plan fitted a model at the owner")

    monkeypatch.setattr(MarginalsModel, "fit", no_fit)
    sketch = mech.release(_chain(3000, np.random.default_rng(2)), rng=np.random.default_rng(3))
    pairs = [m.clique for m in sketch.measurements[5:]]
    assert len(pairs) == len(set(pairs)) == 6 and len(sketch.selections) == 6
    assert sketch.rho_spent == pytest.approx(mech.rho, rel=1e-9)
    with pytest.raises(ValueError, match="spends rho"):
        MarginalsSketch(mech, sketch.measurements, (*sketch.selections, sketch.selections[0]))
    cheat = list(sketch.measurements)
    cheat[-1] = Measurement(cheat[-1].clique, cheat[-1].values, cheat[-1].sigma / 2)
    with pytest.raises(ValueError, match="spends rho"):
        MarginalsSketch(mech, tuple(cheat), sketch.selections)
    assert math.isfinite(sketch.count_estimate)


def test_a_derived_plan_that_reaches_every_pair_selects_nothing() -> None:
    """K at least every candidate pair: which pairs are measured is public, so the plan spends
    nothing on selection (one round, epsilon 0, no selection recorded) and its measurements get
    the whole (1 - o) rho: sigma^2 is 0.9 times that of one stated round of the same K (the
    control, which still pays the exponential mechanisms)."""
    domain = _binary(5)
    mech = MarginalsMechanism(
        marginals_map(domain, 2, measurements=10), domain, 1.0, 1e-6, weight_by_cells=False
    )
    assert mech.measures_every_pair and mech.rounds == 1
    (plan,) = mech.plan()
    assert plan.selections == 10 and plan.epsilon == 0.0
    stated = MarginalsMechanism(
        marginals_map(domain, 2, rounds=1, measurements=10),
        domain,
        1.0,
        1e-6,
        oneway_share=mech.oneway_share,
    )
    assert not stated.measures_every_pair and stated.plan()[0].epsilon > 0
    assert plan.sigma**2 == pytest.approx(0.9 * stated.plan()[0].sigma ** 2, rel=1e-12)
    sketch = mech.release(_chain(2000, np.random.default_rng(4)), rng=np.random.default_rng(5))
    assert [m.clique for m in sketch.measurements[5:]] == mech.candidates()
    assert sketch.selections == ()
    assert sketch.rho_spent == pytest.approx(mech.rho, rel=1e-9)


def test_noise_weighted_by_cells_spends_the_same_rho_for_less_summed_error() -> None:
    """Every pair measured, each at sigma_ab ∝ c_ab^(-1/3): the pairs' rho still adds up to
    (1 - o) rho (the release to rho exactly), a larger pair gets less noise, and the summed
    expected L1 error sum c_ab sigma_ab is below the equal allocation's (the control, which is
    what the Lagrange condition improves on)."""
    domain = Domain(
        np.zeros(4),
        np.ones(4),
        levels=(None, np.array([0.0, 1.0]), np.array([0.0, 1.0]), None),
    )
    fmap = marginals_map(domain, [8, 2, 2, 6], measurements=6)
    weighted = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    equal = MarginalsMechanism(fmap, domain, 1.0, 1e-6, weight_by_cells=False)
    assert weighted.weight_by_cells and weighted.oneway_share == equal.oneway_share
    sigmas, flat = weighted.pair_sigmas(), equal.pair_sigmas()
    rho_m = (1.0 - weighted.oneway_share) * weighted.rho
    assert sum(gaussian_zcdp_rho(s) for s in sigmas.values()) == pytest.approx(rho_m, rel=1e-12)
    assert sum(gaussian_zcdp_rho(s) for s in flat.values()) == pytest.approx(rho_m, rel=1e-12)
    cells = {c: int(fmap.cells[c[0]] * fmap.cells[c[1]]) for c in sigmas}
    assert sigmas[0, 3] < sigmas[1, 2]  # 48 cells against 4
    assert sum(cells[c] * sigmas[c] for c in cells) < 0.95 * sum(cells[c] * flat[c] for c in cells)
    rng = np.random.default_rng(6)
    records = np.column_stack(
        [rng.random(500), rng.integers(0, 2, 500), rng.integers(0, 2, 500), rng.random(500)]
    )
    sketch = weighted.release(records, rng=np.random.default_rng(7))
    assert {m.clique: m.sigma for m in sketch.measurements[4:]} == pytest.approx(sigmas)
    assert sketch.rho_spent == pytest.approx(weighted.rho, rel=1e-9)
    with pytest.raises(ValueError, match="every pair"):
        MarginalsMechanism(
            marginals_map(domain, 4, measurements=3), domain, 1.0, 1e-6
        ).pair_sigmas()


def test_the_derived_one_way_share_grows_as_fewer_pairs_are_measured() -> None:
    """Few pairs measured: most pairs are answered through the product of their 1-way
    marginals, so the 1-way measurements get more of rho; every pair measured: the floor 0.1
    (the pairs carry the 1-way marginals). A plan that states its rounds keeps ONEWAY_SHARE."""
    cells = [10, 2, 12, 6, 6, 15, 13, 2, 2, 2, 2, 2]
    few, all_pairs = default_oneway_share(cells, 11), default_oneway_share(cells, 66)
    assert few > 0.3 and all_pairs == pytest.approx(0.1)
    assert default_oneway_share(cells, 30) < few
    domain = _binary(5)
    derived = MarginalsMechanism(marginals_map(domain, 2, measurements=4), domain, 1.0, 1e-6)
    assert derived.oneway_share == pytest.approx(default_oneway_share([2] * 5, 4))
    stated = MarginalsMechanism(
        marginals_map(domain, 2, rounds=2, measurements=4), domain, 1.0, 1e-6
    )
    assert stated.oneway_share == ONEWAY_SHARE and not stated.weight_by_cells


def test_the_every_pair_plan_keeps_the_consumer_s_model_within_its_cap() -> None:
    """Eight columns of GSSvocab's cells: every pair measured would be one junction-tree
    clique of ~28 MB (the control: twenty times the cap and more); the
    every-pair plan keeps the pairs that stay within EVERY_PAIR_MAX_MODEL_MB, fewest cells
    first, and no dropped pair fits beside them. The release measures exactly those pairs and
    spends its rho exactly (the accounting is over the pairs measured)."""
    cells = [20, 2, 2, 5, 5, 11, 8, 21]
    domain = Domain(np.zeros(8), np.ones(8))
    fmap = marginals_map(domain, cells, measurements=28)
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    assert mech.measures_every_pair and len(mech.candidates()) == 28
    ones: list[tuple[int, ...]] = [(j,) for j in range(8)]
    assert model_size_mb(fmap, [*ones, *mech.candidates()]) > 20 * EVERY_PAIR_MAX_MODEL_MB
    pairs = mech.every_pair_plan()
    assert pairs == sorted(pairs) and 20 <= len(pairs) < 28
    assert model_size_mb(fmap, [*ones, *pairs]) <= EVERY_PAIR_MAX_MODEL_MB
    for dropped in set(mech.candidates()) - set(pairs):
        assert model_size_mb(fmap, [*ones, *pairs, dropped]) > EVERY_PAIR_MAX_MODEL_MB
    (plan,) = mech.plan()
    assert plan.selections == len(pairs) and plan.epsilon == 0.0
    sigmas = mech.pair_sigmas()
    rho_m = (1.0 - mech.oneway_share) * mech.rho
    assert set(sigmas) == set(pairs)
    assert sum(gaussian_zcdp_rho(s) for s in sigmas.values()) == pytest.approx(rho_m, rel=1e-12)
    rng = np.random.default_rng(8)
    sketch = mech.release(rng.random((400, 8)), rng=np.random.default_rng(9))
    assert [m.clique for m in sketch.measurements[8:]] == pairs and sketch.selections == ()
    assert {m.clique: m.sigma for m in sketch.measurements[8:]} == pytest.approx(sigmas)
    assert sketch.rho_spent == pytest.approx(mech.rho, rel=1e-9)
