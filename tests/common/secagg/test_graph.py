"""The sparse graph of SecAgg+: its seed, its choices, and the numbers of its derivation.

The bounds of :mod:`dpmarket.common.secagg.graph` are checked three ways: known answers (the
parameters the module docstring states), minimality (``k - 1`` misses the target), and against the
random graph itself, by simulation on graphs small enough to enumerate every set of sites.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
from scipy.stats import binomtest, chisquare, hypergeom

from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError
from dpmarket.common.secagg.graph import (
    SECURITY_BITS,
    NeighbourGraph,
    choose_neighbours,
    cohesion_failure_bound,
    expected_degree,
    failure_bound,
    graph_seed,
    min_neighbours,
    nonce_commitment,
    plan_graph,
    secrecy_failure_bound,
)

TARGET = 2.0**-SECURITY_BITS


@pytest.mark.parametrize(
    ("sites", "colluders", "allowance", "k"),
    [
        (100, 5, 5, 15),
        (100, 10, 5, 19),
        (100, 33, 5, 30),
        (100, 5, 2, 9),
        (100, 33, 2, 22),
        (20, 6, 2, 10),
        (1000, 50, 5, 19),
        (1000, 100, 5, 22),
    ],
)
def test_the_least_k_meets_the_target_and_k_minus_one_does_not(
    sites: int, colluders: int, allowance: int, k: int
) -> None:
    """The numbers stated in the module docstring, and that each is the least that works."""
    assert min_neighbours(sites, colluders, allowance) == k
    assert failure_bound(sites, colluders, k, allowance) <= TARGET
    assert failure_bound(sites, colluders, k - 1, allowance) > TARGET


def test_k_grows_like_log_s_and_the_degree_stays_far_below_s() -> None:
    """At 5% colluders and an allowance of 5, k goes from 15 at S = 100 to 19 at S = 1,000 (the
    complete graph's degree grows tenfold), and the mean degree is 28 of 99 at S = 100."""
    assert min_neighbours(200, 10, 5) == 17
    assert expected_degree(100, 15) == pytest.approx(27.73, abs=0.01)
    assert expected_degree(1000, 19) == pytest.approx(37.64, abs=0.01)


def test_the_secrecy_bound_is_the_exact_union_of_per_site_failures() -> None:
    """Condition A at one honest site: ``1 + h_v <= 2 Delta`` with ``h_v`` its honest degree.
    Over 4,000 random graphs of 12 sites (3 colluders, k = 3, Delta = 2), the frequency at
    site 0 matches ``secrecy_failure_bound / S_H`` (a two-sided binomial test, p > 1e-4), and the
    frequency of a failure at any honest site stays below the union bound."""
    sites, colluders, k, allowance = 12, 3, 3, 2
    honest = sites - colluders
    colluding = set(range(sites - colluders, sites))
    per_site = secrecy_failure_bound(sites, colluders, k, allowance) / honest
    rng = np.random.default_rng(1)
    hits = anywhere = 0
    trials = 4000
    for _ in range(trials):
        adjacency = _adjacency(choose_neighbours(rng.bytes(32), sites, k), sites)
        degrees = [len(set(np.flatnonzero(adjacency[v])) - colluding) for v in range(honest)]
        failed = [1 + d <= 2 * allowance for d in degrees]
        hits += failed[0]
        anywhere += any(failed)
    assert 0.05 < per_site < 0.5  # the regime where the test has power
    assert binomtest(hits, trials, per_site).pvalue > 1e-4
    assert anywhere / trials <= per_site * honest + 4 * math.sqrt(per_site * honest / trials)


def test_the_cohesion_bound_holds_against_every_set_of_a_small_graph() -> None:
    """Condition B by exhaustion: on 10 sites (2 colluders, k = 3, Delta = 1), every set T of at
    most half the honest sites is checked for "every member has at most Delta honest neighbours
    outside T". The frequency of graphs with such a set stays below the union bound (which is in
    (0.05, 1) here, so it is tested, not vacuous), within four standard errors."""
    sites, colluders, k, allowance = 10, 2, 3, 1
    honest = list(range(sites - colluders))
    bound = cohesion_failure_bound(sites, colluders, k, allowance)
    assert 0.05 < bound < 1.0
    subsets = [
        set(c) for s in range(1, len(honest) // 2 + 1) for c in itertools.combinations(honest, s)
    ]
    rng = np.random.default_rng(2)
    trials = 1500
    bad = 0
    for _ in range(trials):
        adjacency = _adjacency(choose_neighbours(rng.bytes(32), sites, k), sites)
        neighbours = [set(np.flatnonzero(adjacency[v])) & set(honest) for v in honest]
        bad += any(all(len(neighbours[v] - t) <= allowance for v in t) for t in subsets)
    assert bad / trials <= bound + 4 * math.sqrt(bound / trials)


def test_the_product_bound_holds_for_one_fixed_set() -> None:
    """The negative-association step: for a fixed set T of 3 honest sites among 14 (k = 2,
    Delta = 3), P[every member keeps at most Delta honest neighbours outside T] is at most the
    product of the members' marginal probabilities, measured over 6,000 graphs."""
    sites, k, allowance = 14, 2, 3
    honest, members = list(range(sites)), [0, 1, 2]
    rng = np.random.default_rng(3)
    trials = 6000
    joint = 0
    single = np.zeros(len(members))
    for _ in range(trials):
        adjacency = _adjacency(choose_neighbours(rng.bytes(32), sites, k), sites)
        outside = [
            len(set(np.flatnonzero(adjacency[v])) & (set(honest) - set(members))) for v in members
        ]
        ok = [o <= allowance for o in outside]
        joint += all(ok)
        single += ok
    product = float(np.prod(single / trials))
    assert product > 0.05  # not a vacuous comparison
    assert joint / trials <= product + 4 * math.sqrt(product / trials)


def test_choices_are_distinct_exclude_the_chooser_and_are_uniform() -> None:
    """Each row holds k distinct sites other than its own; over 3,000 seeds, the sites site 0
    chooses are uniform over the 19 others (chi-square, p > 1e-4), and the choice is a function
    of the seed alone."""
    sites, k = 20, 4
    seed = bytes(range(32))
    rows = choose_neighbours(seed, sites, k)
    np.testing.assert_array_equal(rows, choose_neighbours(seed, sites, k))
    for i, row in enumerate(rows):
        assert len(set(row.tolist())) == k and i not in row
    rng = np.random.default_rng(4)
    counts = np.zeros(sites)
    for _ in range(3000):
        np.add.at(counts, choose_neighbours(rng.bytes(32), sites, k)[0], 1)
    assert counts[0] == 0
    assert chisquare(counts[1:]).pvalue > 1e-4


def test_the_graph_is_symmetric_and_thresholds_are_k_v_minus_the_allowance() -> None:
    names = [f"s{i:02d}" for i in range(30)]
    graph = NeighbourGraph.build(names, os.urandom(32), 5, 3)
    for site in names:
        assert site not in graph.neighbours(site)
        assert len(graph.neighbours(site)) >= 5
        assert graph.threshold(site) == len(graph.closed(site)) - 3
        for other in graph.neighbours(site):
            assert site in graph.neighbours(other)
    assert [graph.index(s) for s in names] == list(range(30))


def test_the_seed_needs_every_committed_nonce_each_opening_its_commitment() -> None:
    round_id, digest = os.urandom(32), os.urandom(32)
    nonces = {f"s{i}": os.urandom(32) for i in range(4)}
    commitments = {s: nonce_commitment(round_id, s, n) for s, n in nonces.items()}
    seed = graph_seed(digest, nonces, commitments, round_id)
    assert seed == graph_seed(digest, dict(reversed(list(nonces.items()))), commitments, round_id)
    assert seed != graph_seed(os.urandom(32), nonces, commitments, round_id)
    with pytest.raises(SecAggError, match=r"revealed no graph nonce: \['s3'\]"):
        graph_seed(digest, {s: n for s, n in nonces.items() if s != "s3"}, commitments, round_id)
    with pytest.raises(SecAggError, match="'s1' does not open its commitment"):
        graph_seed(digest, {**nonces, "s1": os.urandom(32)}, commitments, round_id)
    with pytest.raises(SecAggError, match="without a commitment"):
        graph_seed(digest, {**nonces, "s9": os.urandom(32)}, commitments, round_id)
    # A commitment is bound to the round and the site.
    assert nonce_commitment(os.urandom(32), "s0", nonces["s0"]) != commitments["s0"]
    assert nonce_commitment(round_id, "s1", nonces["s0"]) != commitments["s0"]


def test_round_params_refuse_a_sparse_graph_below_the_target() -> None:
    names = [f"s{i:03d}" for i in range(100)]
    fp = FixedPoint(1.0, 16, 100)
    params = RoundParams.create(names, 0, 8, fp, colluders=5, neighbours=15, allowance=5)
    assert params.sparse and params.threshold == 0
    with pytest.raises(ValueError, match=r"k=14 neighbours .* above 2\^-40"):
        RoundParams.create(names, 0, 8, fp, colluders=5, neighbours=14, allowance=5)
    with pytest.raises(ValueError, match="threshold must be 0, got 53"):
        RoundParams.create(names, 53, 8, fp, colluders=5, neighbours=15, allowance=5)
    with pytest.raises(ValueError, match=r"allowance must lie in \[0, neighbours - 1\]"):
        RoundParams.create(names, 0, 8, fp, colluders=5, neighbours=15, allowance=15)
    with pytest.raises(ValueError, match="no dropout allowance"):
        RoundParams.create(names, 53, 8, fp, colluders=5, allowance=2)
    # The graph's parameters are bound into the digest every attestation covers.
    other = RoundParams(params.round_id, params.sites, 0, 8, fp, 5, 16, 5)
    assert other.digest != params.digest


def test_the_plan_keeps_the_complete_graph_for_small_rounds_and_dense_graphs() -> None:
    assert plan_graph(20, 1, 2) is None  # below SPARSE_MIN_SITES
    plan = plan_graph(100, 5, 5)
    assert plan is not None and (plan.neighbours, plan.allowance) == (15, 5)
    assert plan.failure <= TARGET
    # 60 of 100 colluding: no k whose mean degree is below half of the complete graph's.
    assert plan_graph(100, 60, 5) is None
    assert hypergeom.pmf(0, 99, 5, 15) > 0  # scipy is the one the bounds use


def _adjacency(choices: np.ndarray, sites: int) -> np.ndarray:
    adjacency = np.zeros((sites, sites), dtype=bool)
    for i, row in enumerate(choices):
        adjacency[i, row] = True
    return adjacency | adjacency.T
