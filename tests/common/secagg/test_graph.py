"""The sparse graph of SecAgg+: its seed, its choices, its ring, and the numbers of its derivation.

The bounds of :mod:`dpmarket.common.secagg.graph` are checked four ways: known answers (the
parameters the module docstring states), minimality (``k - 1`` or a ring 2 smaller misses the
target), exhaustive enumeration of every graph on 5 and 6 sites (the per-site probability of
Condition A is exact, the bound never below the true probability), and against the random graph
itself, by simulation on graphs small enough to enumerate every set of sites.
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest
from scipy.stats import binom, binomtest, chisquare, hypergeom

import dpmarket.common.secagg.graph as graph_module
from dpmarket.common.secagg import FixedPoint, RoundParams, SecAggError
from dpmarket.common.secagg.graph import (
    SECURITY_BITS,
    NeighbourGraph,
    best_graph,
    choose_neighbours,
    cohesion_failure_bound,
    expected_degree,
    failure_bound,
    graph_seed,
    min_neighbours,
    nonce_commitment,
    plan_graph,
    ring_order,
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


@pytest.mark.parametrize(
    ("sites", "colluders", "k", "allowance", "ring"), [(10, 2, 3, 1, 0), (10, 1, 2, 1, 2)]
)
def test_the_cohesion_bound_holds_against_every_set_of_a_small_graph(
    sites: int, colluders: int, k: int, allowance: int, ring: int
) -> None:
    """Condition B by exhaustion of the sets: on 10 sites (the k-out graph with 2 colluders,
    k = 3, Delta = 1; and with 1 colluder, k = 2 and a ring of 2), every set T of Delta + 1 to
    half the honest sites is checked for "every member has at most Delta honest neighbours
    outside T". Over graphs built by :meth:`NeighbourGraph.build`, the frequency of graphs with
    such a set stays below the bound (which is in (0.05, 1) here, so it is tested, not vacuous),
    within four standard errors; so does the frequency of "Condition A fails somewhere or such a
    set exists" below :func:`failure_bound` (smaller sets occur only where A fails)."""
    names = [f"s{i}" for i in range(sites)]
    honest = set(range(sites - colluders))
    bound = cohesion_failure_bound(sites, colluders, k, allowance, ring)
    assert 0.05 < bound < 1.0
    total = failure_bound(sites, colluders, k, allowance, ring)
    subsets = [
        set(c)
        for s in range(allowance + 1, len(honest) // 2 + 1)
        for c in itertools.combinations(sorted(honest), s)
    ]
    rng = np.random.default_rng(2)
    trials = 1500
    bad = either = 0
    for _ in range(trials):
        graph = NeighbourGraph.build(names, rng.bytes(32), k, allowance, ring)
        neighbours = [set(np.flatnonzero(graph.adjacency[v])) & honest for v in range(sites)]
        cohesive = any(all(len(neighbours[v] - t) <= allowance for v in t) for t in subsets)
        secrecy = any(1 + len(neighbours[v]) <= 2 * allowance for v in honest)
        bad += cohesive
        either += cohesive or secrecy
    assert bad / trials <= bound + 4 * math.sqrt(bound / trials)
    if total < 1.0:
        assert either / trials <= total + 4 * math.sqrt(total / trials)


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
    with pytest.raises(ValueError, match=r"k=14 neighbours, a ring of 0 .* above 2\^-40"):
        RoundParams.create(names, 0, 8, fp, colluders=5, neighbours=14, allowance=5)
    with pytest.raises(ValueError, match="threshold must be 0, got 53"):
        RoundParams.create(names, 53, 8, fp, colluders=5, neighbours=15, allowance=5)
    with pytest.raises(
        ValueError, match=r"allowance must lie in \[0, max\(neighbours, ring\) - 1\]"
    ):
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


# ------------------------------------------------------------------------------- the ring
def _every_graph(sites: int, k: int, ring: int) -> list[list[set[int]]]:
    """Every graph of :meth:`NeighbourGraph.build`'s distribution on ``sites`` sites, each as
    its neighbour sets, equally likely: every choice of ``k`` others per site, times every
    cyclic order of the ring (the orders starting at site 0: rotations give the same ring)."""
    choice_sets = [
        list(itertools.combinations([j for j in range(sites) if j != i], k)) for i in range(sites)
    ]
    orders = [(0, *rest) for rest in itertools.permutations(range(1, sites))] if ring else [()]
    graphs = []
    for choices in itertools.product(*choice_sets):
        for order in orders:
            neighbours: list[set[int]] = [set() for _ in range(sites)]
            for v, chosen in enumerate(choices):
                for u in chosen:
                    neighbours[v].add(u)
                    neighbours[u].add(v)
            for p, v in enumerate(order):
                for offset in range(1, ring // 2 + 1):
                    u = order[(p + offset) % sites]
                    neighbours[v].add(u)
                    neighbours[u].add(v)
            graphs.append(neighbours)
    return graphs


@pytest.mark.parametrize(
    ("sites", "colluders", "k", "allowance", "ring"),
    [(6, 1, 1, 0, 0), (6, 1, 1, 1, 0), (5, 1, 1, 0, 2), (5, 1, 1, 1, 2)],
)
def test_the_bounds_hold_over_every_graph_of_a_few_sites(
    sites: int, colluders: int, k: int, allowance: int, ring: int
) -> None:
    """Exhaustive enumeration: every graph on 6 sites (the k-out graph, k = 1: 15,625 graphs) or
    5 (k = 1 and a ring of 2: 24,576), the last ``colluders`` sites colluding. The probability
    that Condition A fails at honest site 0 is exactly ``secrecy_failure_bound / S_H``; the true
    probabilities of "A fails somewhere", of "some set of Delta + 1 to half the honest sites is
    cohesive" and of either are at most :func:`secrecy_failure_bound`,
    :func:`cohesion_failure_bound` and :func:`failure_bound`."""
    honest = set(range(sites - colluders))
    subsets = [
        set(c)
        for s in range(allowance + 1, len(honest) // 2 + 1)
        for c in itertools.combinations(sorted(honest), s)
    ]
    graphs = _every_graph(sites, k, ring)
    at_zero = somewhere = cohesive = either = 0
    for neighbours in graphs:
        fails = [1 + len(neighbours[v] & honest) <= 2 * allowance for v in sorted(honest)]
        found = any(all(len((neighbours[v] & honest) - t) <= allowance for v in t) for t in subsets)
        at_zero += fails[0]
        somewhere += any(fails)
        cohesive += found
        either += any(fails) or found
    n = len(graphs)
    secrecy = secrecy_failure_bound(sites, colluders, k, allowance, ring)
    assert at_zero / n == pytest.approx(secrecy / len(honest), rel=1e-12, abs=1e-15)
    assert somewhere / n <= secrecy + 1e-12
    assert cohesive / n <= cohesion_failure_bound(sites, colluders, k, allowance, ring) + 1e-12
    assert either / n <= failure_bound(sites, colluders, k, allowance, ring) + 1e-12
    # Not vacuous: with Delta = 1 the exact per-site probability is positive, with Delta = 0
    # (Condition A cannot fail) the cohesion bound is below 1 (0.83 and 0.08).
    assert at_zero > 0 or cohesion_failure_bound(sites, colluders, k, allowance, ring) < 1.0


def test_the_secrecy_bound_with_a_ring_is_the_exact_union_of_per_site_failures() -> None:
    """Condition A on 30 sites (10 colluders, k = 3, a ring of 4, Delta = 2) over 3,000 graphs
    built by :meth:`NeighbourGraph.build`: the frequency at site 0 matches ``secrecy_failure_bound
    / S_H`` (a two-sided binomial test, p > 1e-4) and a failure anywhere stays below the union."""
    sites, colluders, k, allowance, ring = 30, 10, 3, 2, 4
    names = [f"s{i:02d}" for i in range(sites)]
    honest = set(range(sites - colluders))
    per_site = secrecy_failure_bound(sites, colluders, k, allowance, ring) / len(honest)
    rng = np.random.default_rng(7)
    hits = anywhere = 0
    trials = 3000
    for _ in range(trials):
        adjacency = NeighbourGraph.build(names, rng.bytes(32), k, allowance, ring).adjacency
        failed = [
            1 + len(set(np.flatnonzero(adjacency[v])) & honest) <= 2 * allowance
            for v in sorted(honest)
        ]
        hits += failed[0]
        anywhere += any(failed)
    assert 0.02 < per_site < 0.5
    assert binomtest(hits, trials, per_site).pvalue > 1e-4
    union = per_site * len(honest)
    assert anywhere / trials <= union + 4 * math.sqrt(union / trials)


def test_the_hoelder_step_holds_for_one_fixed_set() -> None:
    """For a fixed set T of 3 honest sites among 14 (k = 1, a ring of 2, Delta = 2, no
    colluders), P[every member has at most Delta neighbours outside T] measured over 6,000 graphs
    is at most ``sum_r Hyp(r; n, |X|, ring) g(r)^s``, the term of :func:`cohesion_failure_bound`
    for one set, whatever the dependence the ring puts between the members."""
    sites, k, allowance, ring = 14, 1, 2, 2
    names = [f"s{i:02d}" for i in range(sites)]
    members = {0, 1, 2}
    outside = sites - len(members)
    n, q = sites - 1, k / (sites - 1)
    term = 0.0
    for r in range(0, min(allowance, ring) + 1):
        candidates = outside - r
        g = sum(
            hypergeom.pmf(a, n, candidates, k) * binom.cdf(allowance - r - a, candidates - a, q)
            for a in range(0, allowance - r + 1)
        )
        term += hypergeom.pmf(r, n, outside, ring) * g ** len(members)
    rng = np.random.default_rng(8)
    trials = 6000
    joint = 0
    for _ in range(trials):
        adjacency = NeighbourGraph.build(names, rng.bytes(32), k, allowance, ring).adjacency
        joint += all(len(set(np.flatnonzero(adjacency[v])) - members) <= allowance for v in members)
    assert term > 0.05
    assert joint / trials <= term + 4 * math.sqrt(term / trials)


def test_the_k_out_graph_alone_cannot_do_with_21_choices_against_33_colluders() -> None:
    """The union bound over sites is tight for the k-out graph: by Bonferroni and negative
    association, P[Condition A fails somewhere] >= S_H p - C(S_H, 2) p'^2 (``p'``: the per-site
    probability with one more site not counted as honest). At S = 100, S_C = 33, Delta = 2 that
    lower bound is above 2^-40 for k = 21, so no analysis of that graph gets below k = 22; the
    ring is what lowers the degree."""
    sites, colluders, allowance = 100, 33, 2
    honest = sites - colluders
    p = secrecy_failure_bound(sites, colluders, 21, allowance) / honest
    p_minus = secrecy_failure_bound(sites, colluders + 1, 21, allowance) / (honest - 1)
    lower = honest * p - math.comb(honest, 2) * p_minus**2
    assert lower > TARGET
    assert lower > (1 - 2.0**-30) * honest * p
    assert min_neighbours(sites, colluders, allowance) == 22


def test_a_plan_at_a_measurable_target_meets_it_and_a_smaller_degree_does_not() -> None:
    """The planner against the graphs it builds, at a target loose enough to measure: 40 sites,
    CAPE's default 13 colluders, Delta = 2 and a target of 2^-4 give k = 6 and a ring of 4. Over
    4,000 graphs of :meth:`NeighbourGraph.build`, Condition A fails somewhere (an honest site
    with at most 2 Delta - 1 honest neighbours) in about 2 % of them, within the bound and
    below the target. The controls, the same k with a ring 2 smaller and the k-out graph alone
    one choice below its own least k (8), each with its bound above the target, fail in about
    8 to 10 %: significantly above the target (one-sided binomial tests, p < 1e-4), so the
    degree the bound asks for is needed by the graph itself, not only by the bound."""
    sites, colluders, allowance, bits = 40, 13, 2, 4
    target = 2.0**-bits
    plan = best_graph(sites, colluders, allowance, bits=bits)
    assert plan is not None and (plan.neighbours, plan.ring) == (6, 4)
    assert min_neighbours(sites, colluders, allowance, bits) == 8
    names = [f"s{i:02d}" for i in range(sites)]
    honest = sites - colluders
    trials = 4000

    def failures(k: int, ring: int) -> int:
        rng = np.random.default_rng(12 + 100 * k + ring)
        count = 0
        for _ in range(trials):
            adjacency = NeighbourGraph.build(names, rng.bytes(32), k, allowance, ring).adjacency
            honest_degrees = adjacency[:honest, :honest].sum(axis=1)  # the last S_C collude
            count += bool(np.any(1 + honest_degrees <= 2 * allowance))
        return count

    bound = secrecy_failure_bound(sites, colluders, plan.neighbours, allowance, plan.ring)
    assert plan.failure <= target and bound < 0.5 * target
    planned = failures(plan.neighbours, plan.ring)
    assert planned / trials <= bound + 4 * math.sqrt(bound / trials)
    assert binomtest(planned, trials, target, alternative="less").pvalue < 1e-6
    for k, ring in ((plan.neighbours, plan.ring - 2), (7, 0)):
        assert failure_bound(sites, colluders, k, allowance, ring) > target
        assert binomtest(failures(k, ring), trials, target, alternative="greater").pvalue < 1e-4


@pytest.mark.parametrize(
    ("sites", "colluders", "allowance", "k", "ring", "degree"),
    [
        (100, 33, 2, 8, 22, 33.94),
        (100, 5, 2, 5, 8, 16.96),
        (100, 33, 5, 13, 30, 46.93),
        (100, 5, 5, 15, 0, 27.73),
    ],
)
def test_the_best_graph_is_the_one_the_docstring_states_and_locally_least(
    sites: int, colluders: int, allowance: int, k: int, ring: int, degree: float
) -> None:
    """The plans of the module docstring; each meets the target, and neither a ring 2 smaller
    nor one choice fewer does; at S_C = 33 the mean degree is 13 % below the k-out graph's."""
    plan = best_graph(sites, colluders, allowance)
    assert plan is not None
    assert (plan.neighbours, plan.ring) == (k, ring)
    assert plan.mean_degree == pytest.approx(degree, abs=0.01)
    assert plan.failure == failure_bound(sites, colluders, k, allowance, ring) <= TARGET
    if ring:
        assert failure_bound(sites, colluders, k, allowance, ring - 2) > TARGET
    assert failure_bound(sites, colluders, k - 1, allowance, ring) > TARGET
    alone = min_neighbours(sites, colluders, allowance)
    assert alone is not None and plan.mean_degree <= expected_degree(sites, alone)
    if (colluders, allowance) == (33, 2):
        assert plan.mean_degree / expected_degree(sites, alone) == pytest.approx(0.868, abs=1e-3)


def test_the_ring_is_a_uniform_cyclic_order_and_every_site_has_its_ring_neighbours() -> None:
    """The order is a permutation and a function of the seed alone; over 3,000 seeds the
    position of site 0 is uniform (chi-square, p > 1e-4); in the built graph every site is
    adjacent to the ring / 2 sites on either side of it, so its degree is at least the ring."""
    seed = bytes(range(32))
    order = ring_order(seed, 20)
    assert sorted(order.tolist()) == list(range(20))
    np.testing.assert_array_equal(order, ring_order(seed, 20))
    rng = np.random.default_rng(9)
    counts = np.zeros(20)
    for _ in range(3000):
        counts[int(np.flatnonzero(ring_order(rng.bytes(32), 20) == 0)[0])] += 1
    assert chisquare(counts).pvalue > 1e-4
    names = [f"s{i:02d}" for i in range(20)]
    graph = NeighbourGraph.build(names, seed, 2, 1, 6)
    for p, v in enumerate(order.tolist()):
        around = {names[order[(p + d) % 20]] for d in (-3, -2, -1, 1, 2, 3)}
        assert around <= graph.neighbours(names[v])
        assert graph.threshold(names[v]) == len(graph.closed(names[v])) - 1
        for other in graph.neighbours(names[v]):
            assert names[v] in graph.neighbours(other)
    for ring in (-2, 3, 20):
        with pytest.raises(ValueError, match="ring's degree must be even"):
            NeighbourGraph.build(names, seed, 2, 1, ring)


def test_round_params_carry_the_ring_into_validation_and_the_digest() -> None:
    names = [f"s{i:03d}" for i in range(100)]
    fp = FixedPoint(1.0, 16, 100)
    params = RoundParams.create(names, 0, 8, fp, colluders=33, neighbours=8, allowance=2, ring=22)
    assert params.sparse and params.ring == 22
    with pytest.raises(ValueError, match=r"k=8 neighbours, a ring of 20 .* above 2\^-40"):
        RoundParams.create(names, 0, 8, fp, colluders=33, neighbours=8, allowance=2, ring=20)
    with pytest.raises(ValueError, match="ring's degree must be even"):
        RoundParams.create(names, 0, 8, fp, colluders=33, neighbours=8, allowance=2, ring=23)
    with pytest.raises(ValueError, match="complete-graph round has no ring"):
        RoundParams.create(names, 67, 8, fp, colluders=33, ring=22)
    other = RoundParams(params.round_id, params.sites, 0, 8, fp, 33, 8, 2, 24)
    assert other.digest != params.digest
    # Without a ring, the digest is the one rounds had before the ring existed.
    bare = RoundParams(params.round_id, params.sites, 0, 8, fp, 5, 15, 5)
    assert bare.digest == RoundParams(params.round_id, params.sites, 0, 8, fp, 5, 15, 5, 0).digest


def test_graph_helpers_match_scipy() -> None:
    """The log-gamma hypergeometric and the binomial tail the bounds use agree with
    ``scipy.stats`` (to 1e-9 relative) over random arguments, edges of the support included."""
    rng = np.random.default_rng(10)
    for _ in range(500):
        total = int(rng.integers(1, 300))
        marked, draws = int(rng.integers(0, total + 1)), int(rng.integers(0, total + 1))
        x = int(rng.integers(-2, draws + 3))
        expected = hypergeom.pmf(x, total, marked, draws) if x >= 0 else 0.0
        found = float(graph_module._hyp(x, total, marked, draws))
        assert found == pytest.approx(expected, rel=1e-9)
        trials, upto, p = int(rng.integers(0, 200)), int(rng.integers(-3, 205)), rng.random()
        expected = binom.cdf(upto, trials, p)
        assert float(graph_module._binom_cdf(upto, trials, p)) == pytest.approx(expected, rel=1e-9)


def _adjacency(choices: np.ndarray, sites: int) -> np.ndarray:
    adjacency = np.zeros((sites, sites), dtype=bool)
    for i, row in enumerate(choices):
        adjacency[i, row] = True
    return adjacency | adjacency.T
