"""The owner's summarization kernels on one partition of its points, and how their results merge.

An owner whose table is larger than memory computes partition by partition (DESIGN, "Deployment
and scale"): the h1 features of a partition are computed, used and dropped, never held for the
whole table. What each step needs from a partition, and how the owner merges the partitions'
answers into the answer the in-memory owner gives:

* **bids** — the best unsent point of each partition (:func:`partition_best`), then the best of
  the bests (:func:`merge_best`, ties to the lowest global index, as ``np.argmax`` over the whole
  table): the same point as the in-memory owner's;
* **relevance counts** — a count per partition, summed: the same count;
* **candidates** — a local greedy per partition, then a greedy over the union of the partitions'
  choices (GreeDi, :func:`greedi_merge`; Mirzasoleiman et al. 2013), with stochastic greedy
  (:func:`stochastic_greedy`; Mirzasoleiman et al. 2015) in a partition too large to scan once
  per candidate. Not the in-memory owner's greedy: within a stated factor of it (the tests
  measure MMD² on scenarios);
* **uniform samples** — how many points each partition gives, drawn from the multivariate
  hypergeometric law (:func:`sample_counts`: the counts of a uniform sample without replacement
  of the whole table), then a uniform sample of that size within each partition: together, a
  uniform sample without replacement.

Privacy: every row still contributes once to whatever the owner releases (a sum is a sum, a
selection is a selection of rows), so the analysis of each mechanism is unchanged; the noise is
drawn once, by the owner, after the merge — never per partition.

Pure: no I/O (the owner reads the partitions, :mod:`dpmarket.owner.partitioned`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.summarization.kernels import bid_scores, embedding_greedy
from dpmarket.common.validation import check_positive_int, check_vector

__all__ = [
    "DEFAULT_GREEDY_EVALUATIONS",
    "STOCHASTIC_EPSILON",
    "Best",
    "greedi_merge",
    "local_greedy",
    "merge_best",
    "partition_best",
    "sample_counts",
    "stochastic_greedy",
]

#: Most point scorings (rows x greedy steps) an exact local greedy may do in one block of a
#: partition; above it the block runs stochastic greedy. 2^22: 32 steps over a block of 2^17
#: rows, about what computing the block's features costs (a greedy step is one matrix-vector
#: product over the block's features; the features, 10 columns to d = 140 with a cosine, cost
#: some 30 such products).
DEFAULT_GREEDY_EVALUATIONS = 1 << 22
#: Stochastic greedy's epsilon: in expectation it achieves (1 - 1/e - epsilon) of the optimum.
STOCHASTIC_EPSILON = 0.01


@dataclass(frozen=True)
class Best:
    """The best unsent point of a partition (or of the table).

    Attributes
    ----------
    score : float
        Its bid, ``h1(x) . direction`` in float32 arithmetic (as :func:`bid_scores`).
    index : int
        Its global row index.
    """

    score: float
    index: int


def partition_best(
    features: ArrayLike, direction: ArrayLike, offset: int, exclude: ArrayLike = ()
) -> Best | None:
    """The best point of one partition: the highest score, ties to the lowest index.

    Parameters
    ----------
    features : array-like of shape (rows, d), float32
        h1 features of the partition's rows.
    direction : array-like of shape (d,)
        :func:`dpmarket.common.summarization.kernels.bid_direction`.
    offset : int
        Global index of the partition's first row.
    exclude : array-like of int
        Local indices (``0 <= i < rows``) that may not be chosen (points already sent).

    Returns
    -------
    Best or None
        ``None`` when every row is excluded.
    """
    scores = bid_scores(features, direction)
    excluded = np.asarray(exclude, dtype=np.int64)
    if excluded.size:
        scores[excluded] = -np.inf
    if scores.size == 0:
        return None
    i = int(np.argmax(scores))
    if np.isneginf(scores[i]):
        return None
    return Best(float(scores[i]), offset + i)


def merge_best(bests: Sequence[Best | None]) -> Best | None:
    """The best of the partitions' bests: highest score, ties to the lowest global index (what
    ``np.argmax`` over the whole table returns)."""
    found = [b for b in bests if b is not None]
    if not found:
        return None
    return min(found, key=lambda b: (-b.score, b.index))


def stochastic_greedy(
    features: ArrayLike,
    target_embedding: ArrayLike,
    k: int,
    rng: np.random.Generator,
    *,
    epsilon: float = STOCHASTIC_EPSILON,
    exclude: ArrayLike = (),
) -> NDArray[np.int64]:
    """Stochastic greedy ("lazier than lazy greedy") for :func:`embedding_greedy`'s objective.

    Each of the ``k`` steps scores a uniform random subset of ``s = ceil((n / k) log(1 /
    epsilon))`` of the available points (all of them when fewer) and adds the best, with the
    same score as :func:`embedding_greedy`: ``h1(x) . (target - q / (q + 1) mean h1(S))``.

    Parameters
    ----------
    features : array-like of shape (n, d)
        float32 features are scored as an owner scores bids.
    target_embedding : array-like of shape (d,)
    k : int
        ``1 <= k <=`` available points.
    rng : numpy.random.Generator
        Draws the subsets.
    epsilon : float
        ``0 < epsilon < 1``.
    exclude : array-like of int
        Indices that may not be chosen.

    Returns
    -------
    ndarray of shape (k,), int64
        Indices in the order chosen.

    Raises
    ------
    ValueError
        If ``k`` exceeds the available points, or an input is malformed.

    Notes
    -----
    For a monotone submodular objective, stochastic greedy achieves ``1 - 1/e - epsilon`` of the
    optimum in expectation with ``n log(1 / epsilon)`` evaluations in all, independent of ``k``
    (Mirzasoleiman et al. 2015, Theorem 1). The embedding objective is the MMD-based one of the
    summarization paper (Lemma 3), approximately submodular; the tests measure the loss against
    exact greedy on scenarios.

    References
    ----------
    Mirzasoleiman, Badanidiyuru, Karbasi, Vondrak, Krause, "Lazier Than Lazy Greedy", AAAI 2015.
    """
    raw = np.asarray(features)
    f = raw if raw.dtype == np.float32 else np.asarray(raw, dtype=np.float64)
    n, d = f.shape
    gv = check_vector(target_embedding, "target embedding", size=d)
    k = check_positive_int(k, "k")
    if not 0.0 < epsilon < 1.0:
        raise ValueError(f"epsilon must lie in (0, 1), got {epsilon}")
    available = np.ones(n, dtype=bool)
    excluded = np.asarray(exclude, dtype=np.int64)
    if excluded.size:
        available[excluded] = False
    pool = np.flatnonzero(available)
    if k > pool.size:
        raise ValueError(f"k must be <= the {pool.size} available points, got {k}")
    s = min(pool.size, math.ceil(n / k * math.log(1.0 / epsilon)))
    chosen = np.empty(k, dtype=np.int64)
    s_sum = np.zeros(d)
    for t in range(k):
        q = t
        direction = gv - (q / (q + 1.0)) * (s_sum / q if q else 0.0)
        size = min(s, pool.size)
        picks = rng.choice(pool.size, size=size, replace=False) if size < pool.size else None
        subset = pool if picks is None else pool[np.sort(picks)]
        if f.dtype == np.float32:
            scores: NDArray[np.floating] = bid_scores(f[subset], direction.astype(np.float32))
        else:
            scores = f[subset] @ direction
        best = int(subset[int(np.argmax(scores))])
        chosen[t] = best
        s_sum = s_sum + f[best].astype(np.float64)
        pool = pool[pool != best]
    return chosen


def local_greedy(
    features: ArrayLike,
    target_embedding: ArrayLike,
    k: int,
    rng: np.random.Generator,
    *,
    exclude: ArrayLike = (),
    max_evaluations: int = DEFAULT_GREEDY_EVALUATIONS,
) -> tuple[NDArray[np.int64], bool]:
    """GreeDi's first stage in one partition: exact greedy when ``rows x k <= max_evaluations``,
    otherwise stochastic greedy.

    Returns
    -------
    tuple
        ``(indices, stochastic)``: local indices in the order chosen (``min(k, available)`` of
        them), and whether stochastic greedy chose them.
    """
    f = np.asarray(features)
    n = f.shape[0]
    excluded = np.unique(np.asarray(exclude, dtype=np.int64))
    k = min(int(k), n - excluded.size)
    if k <= 0:
        return np.zeros(0, dtype=np.int64), False
    if n * k <= max_evaluations:
        mask = np.zeros(n, dtype=bool)
        mask[excluded] = True
        return embedding_greedy(
            f, target_embedding, np.zeros((0, f.shape[1])), k, exclude=mask
        ), False
    return stochastic_greedy(f, target_embedding, k, rng, exclude=excluded), True


def greedi_merge(
    union_features: ArrayLike,
    target_embedding: ArrayLike,
    k: int,
    *,
    start: ArrayLike | None = None,
) -> NDArray[np.int64]:
    """GreeDi's second stage: the exact greedy over the union of the partitions' choices.

    Parameters
    ----------
    union_features : array-like of shape (m, d)
        Features of every partition's local choice, concatenated in partition order.
    target_embedding : array-like of shape (d,)
    k : int
        ``1 <= k <= m``.
    start : array-like of shape (s, d), optional
        Features of points already chosen, from which the greedy continues (counted in its
        summary, never returned); none by default.

    Returns
    -------
    ndarray of shape (k,), int64
        Indices into the union, in the order chosen.

    Notes
    -----
    GreeDi keeps the better of this merge and the best single partition's choice; for the
    embedding objective the merge over the union contains each partition's choice as a feasible
    solution, and the greedy over it is what the tests compare with single-machine greedy.

    References
    ----------
    Mirzasoleiman, Karbasi, Sarkar, Krause, "Distributed Submodular Maximization: Identifying
    Representative Elements in Massive Data", NeurIPS 2013 (Algorithm 2).
    """
    f = np.asarray(union_features)
    first = np.zeros((0, f.shape[1])) if start is None else np.asarray(start)
    return embedding_greedy(f, target_embedding, first, k)


def sample_counts(
    available: Sequence[int], count: int, rng: np.random.Generator
) -> NDArray[np.int64]:
    """How many points each partition gives to a uniform sample of ``count`` without replacement.

    Parameters
    ----------
    available : sequence of int
        Unsent points per partition.
    count : int
        ``1 <= count <= sum(available)``.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of shape (len(available),), int64
        Drawn from the multivariate hypergeometric law: the counts per partition of a uniform
        sample without replacement from the union, so a uniform sample of that many points within
        each partition makes a uniform sample of the whole.
    """
    avail = np.asarray(available, dtype=np.int64)
    count = check_positive_int(count, "count")
    if count > int(avail.sum()):
        raise ValueError(f"count {count} exceeds the {int(avail.sum())} points not yet sent")
    return rng.multivariate_hypergeometric(avail, count, method="marginals").astype(np.int64)
