"""The pure merge rules of the partitioned owner
(:mod:`dpmarket.common.summarization.partitioned`)."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.summarization.kernels import bid_scores, embedding_greedy
from dpmarket.common.summarization.partitioned import (
    Best,
    greedi_merge,
    local_greedy,
    merge_best,
    partition_best,
    sample_counts,
    stochastic_greedy,
)


def _features(rng: np.random.Generator, n: int, d: int = 16) -> np.ndarray:
    return (rng.normal(size=(n, d)) / np.sqrt(d)).astype(np.float32)


def test_the_best_of_the_partitions_bests_is_the_global_argmax() -> None:
    rng = np.random.default_rng(0)
    f = _features(rng, 1000)
    direction = rng.normal(size=16).astype(np.float32)
    sent = np.array([5, 500, 999])
    scores = bid_scores(f, direction)
    scores[sent] = -np.inf
    bests = [
        partition_best(f[a:b], direction, a, sent[(sent >= a) & (sent < b)] - a)
        for a, b in ((0, 300), (300, 700), (700, 1000))
    ]
    best = merge_best(bests)
    assert best is not None and best.index == int(np.argmax(scores))
    assert best.score == float(scores.max())


def test_ties_go_to_the_lowest_index_and_an_exhausted_partition_offers_nothing() -> None:
    assert merge_best([Best(1.0, 7), Best(1.0, 3), Best(0.5, 1)]) == Best(1.0, 3)
    f = np.ones((3, 2), dtype=np.float32)
    assert partition_best(f, np.ones(2, dtype=np.float32), 10, [0, 1, 2]) is None
    assert merge_best([None]) is None


def test_stochastic_greedy_scans_all_points_when_its_sample_covers_them() -> None:
    """With ``k <= log(1/epsilon)`` the sample size is at least n: each step is exact greedy."""
    rng = np.random.default_rng(1)
    f = _features(rng, 200)
    target = f[:20].astype(np.float64).mean(axis=0)
    exact = embedding_greedy(f, target, np.zeros((0, 16)), 4)
    assert np.array_equal(stochastic_greedy(f, target, 4, rng, epsilon=0.01), exact)


def test_stochastic_greedy_respects_exclusions_and_is_seeded() -> None:
    rng = np.random.default_rng(2)
    f = _features(rng, 5000)
    target = f[:50].astype(np.float64).mean(axis=0)
    excluded = np.arange(0, 5000, 2)
    a = stochastic_greedy(f, target, 50, np.random.default_rng(3), exclude=excluded)
    b = stochastic_greedy(f, target, 50, np.random.default_rng(3), exclude=excluded)
    assert np.array_equal(a, b) and len(set(a.tolist())) == 50
    assert not set(a.tolist()) & set(excluded.tolist())
    with pytest.raises(ValueError, match="k must be <= the 2500 available points"):
        stochastic_greedy(f, target, 2501, rng, exclude=excluded)


def test_local_greedy_switches_to_sampling_above_its_budget() -> None:
    rng = np.random.default_rng(4)
    f = _features(rng, 1000)
    target = f[:10].astype(np.float64).mean(axis=0)
    exact, sampled = local_greedy(f, target, 10, rng, max_evaluations=10_000)
    assert not sampled
    assert np.array_equal(exact, embedding_greedy(f, target, np.zeros((0, 16)), 10))
    _, sampled = local_greedy(f, target, 11, rng, max_evaluations=10_000)
    assert sampled
    few, _ = local_greedy(f[:5], target, 10, rng)
    assert few.size == 5  # a partition gives what it has


def test_greedi_merge_is_greedy_over_the_union() -> None:
    rng = np.random.default_rng(5)
    f = _features(rng, 300)
    target = f[:30].astype(np.float64).mean(axis=0)
    assert np.array_equal(
        greedi_merge(f, target, 12), embedding_greedy(f, target, np.zeros((0, 16)), 12)
    )


def test_sample_counts_follow_the_hypergeometric_law() -> None:
    """Mean counts match ``count * available / total`` within 5 standard errors (failure
    probability below 1e-6 per partition)."""
    rng = np.random.default_rng(6)
    available = np.array([100, 300, 0, 600])
    draws = np.array([sample_counts(available.tolist(), 50, rng) for _ in range(4000)])
    assert (draws.sum(axis=1) == 50).all() and (draws[:, 2] == 0).all()
    assert (draws <= available).all()
    share = available / available.sum()
    expected = 50 * share
    sd = np.sqrt(50 * share * (1 - share) * (1000 - 50) / 999)
    assert np.all(np.abs(draws.mean(axis=0) - expected) <= 5 * sd / np.sqrt(4000) + 1e-12)
    with pytest.raises(ValueError, match="count 1001 exceeds the 1000 points"):
        sample_counts(available.tolist(), 1001, rng)
