"""Value attribution: what each owner's delivered points were worth to the consumer's D_v.

A session delivers a summary ``S`` of ``p`` points, each from one of ``K`` owners, in the order the
curator's greedy added them. Its value to the consumer is the summarization paper's normalized MMD
objective (Eq. 3) against the validation set ``D_v`` (``m`` points), with the session's Gaussian
RBF kernel ``k(x, y) = exp(-gamma ||x - y||^2)`` (``k`` in (0, 1], ``k(x, x) = 1``)::

    J(T) = 2 / (m |T|) sum_{v in D_v, x in T} k(v, x) - 1 / |T|^2 sum_{x, x' in T} k(x, x'),
    J(empty) = 0.

An owner's contribution is read off a cooperative game on the owners. For a coalition ``C`` of
owners let ``S_C`` be their delivered points; every game here is a function of three block sums
of ``S_C``, which :class:`SummaryBlocks` computes once per summary (one kernel pass, ``O(p (m + p)
n_features)`` kernel evaluations), so that a coalition costs ``O(K^2)`` arithmetic on ``K x K``
blocks and never a new kernel matrix::

    n_C = |S_C| = sum_{j in C} n_j,
    A_C = sum_{v in D_v, x in S_C} k(v, x) = sum_{j in C} a_j,
    B_C = sum_{x, x' in S_C} k(x, x')     = sum_{j, l in C} B_jl.

The games (:class:`ObjectiveGame`, :class:`EmbeddingGame`):

* ``v(C) = J(S_C) = 2 A_C / (m n_C) - B_C / n_C^2``: the paper's objective on the coalition's
  points, as a summary of their own (the summary's utility);
* ``e(C) = 2 <mu_V, mu_C> - ||mu_C||^2 = 2 A_C / (m p) - B_C / p^2``: the same objective on the
  coalition's part ``mu_C = (1 / p) sum_{x in S_C} phi(x)`` of the summary's mean embedding
  (its points keep their weight ``1 / p`` in ``S``). ``e(N) = v(N) = J(S)``. Its Shapley values
  have a closed form (:func:`embedding_shapley`) and a sensitivity of ``2 / m`` (one validation
  point) and ``(p - 1) / p^2`` (one delivered point, on the other owners' values), so the private
  payouts use it (:mod:`dpmarket.common.market.payouts`). ``v`` cannot be released so: a lone
  point is judged as a one-point summary, ``J({x}) = 2 mean_v k(v, x) - 1``, which one replaced
  point moves by up to 2, and the Shapley values of every owner with it.

:func:`own_shapley` keeps of each owner's Shapley value of ``v`` the part that is a function of
its own points, ``D_v`` and the public counts alone (:class:`OwnWeights`); it drops the terms
with the other owners' closeness and their redundancy with its points. It ranks owners much as
``v``'s Shapley values do, and since no owner's value reads another owner's points, its private
release (:func:`~dpmarket.common.market.payouts.release_own_payouts`) needs no noise for them.

The rules (each returns an :class:`Attribution`):

==========================  ==========  ==========  ===========  ================================
rule                        efficiency  symmetry    null owner   cost after the blocks
==========================  ==========  ==========  ===========  ================================
:func:`paper_rule`          yes         no          yes          ``O(p)``
:func:`embedding_shapley`   yes         yes         yes          ``O(K^2)`` (closed form,
                                                                 :class:`EmbeddingGame` only)
:func:`exact_shapley`       yes         yes         yes          ``O(2^K K^2)`` time, ``O(2^K)``
                                                                 memory (K <= 20)
:func:`sampled_shapley`     yes         expected    yes          ``O(P K^2)`` for P permutations
:func:`leave_one_out`       no          yes         yes          ``O(K^3)``
:func:`own_shapley`         no          yes         yes          ``O(K^3 p)`` (any K;
                                                                 :class:`ObjectiveGame`'s part)
==========================  ==========  ==========  ===========  ================================

Efficiency: the owners' values sum to ``u(N) - u(empty) = u(N)``. Symmetry: two owners with
``u(C + i) = u(C + j)`` for every ``C`` without either get equal values. Null owner: an owner with
``u(C + i) = u(C)`` for every ``C`` (in particular one with no point in ``S``) gets 0.

References
----------
Summarization paper, Section 2 ("Incentives": "value of a data source's contribution could be
deemed proportional to the sum of winning marginal bids from the source") and Eq. 3; Shapley
(1953); Castro, Gomez & Tejada (2009) for permutation sampling; Mitchell, Cooper, Frank & Holmes
(2022), "Sampling permutations for Shapley value estimation" (JMLR), for antithetic pairs.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.summarization.kernels import rbf_kernel
from dpmarket.common.validation import check_matrix, check_positive_int

__all__ = [
    "MAX_EXACT_OWNERS",
    "Attribution",
    "AttributionRule",
    "EmbeddingGame",
    "ObjectiveGame",
    "OwnWeights",
    "SummaryBlocks",
    "SummaryGame",
    "embedding_shapley",
    "exact_shapley",
    "leave_one_out",
    "own_shapley",
    "own_weights",
    "paper_rule",
    "sampled_shapley",
]

#: The most owners :func:`exact_shapley` enumerates (2^20 coalitions: under a second, 50 MiB).
MAX_EXACT_OWNERS = 20
#: Rows of a kernel block computed at once (bounds memory to ``_CHUNK x max(m, p)`` floats).
_CHUNK = 2048
#: Permutations walked at once by :func:`sampled_shapley`.
_PERMUTATIONS = 1024

AttributionRule = Literal[
    "paper-rule", "shapley-exact", "shapley-sampled", "leave-one-out", "shapley-own"
]


# --------------------------------------------------------------------------------------- blocks
@dataclass(frozen=True)
class SummaryBlocks:
    """The kernel block sums of a delivered summary, per owner and per point in greedy order.

    Build with :meth:`from_summary`; every game and rule of this module reads only these.

    Attributes
    ----------
    owners : tuple of str, length K
        Every owner of the session, those with no delivered point included.
    m : int
        ``|D_v|``.
    counts : ndarray of shape (K,), int64
        ``n_j``, owner j's delivered points.
    cross : ndarray of shape (K,), float64
        ``a_j = sum_{v in D_v, x in S_j} k(v, x)``, in [0, m n_j].
    within : ndarray of shape (K, K), float64, symmetric
        ``B_jl = sum_{x in S_j, y in S_l} k(x, y)`` (``B_jj`` counts the diagonal: ``B_jj >= n_j``).
    point_owner : ndarray of shape (p,), int64
        The index into ``owners`` of each point, in the order the points were added.
    point_cross : ndarray of shape (p,), float64
        ``sum_{v in D_v} k(v, x_i)``.
    point_prior : ndarray of shape (p,), float64
        ``sum_{t < i} k(x_i, x_t)``: the point's kernel sum with the points added before it.
    """

    owners: tuple[str, ...]
    m: int
    counts: NDArray[np.int64]
    cross: NDArray[np.float64]
    within: NDArray[np.float64]
    point_owner: NDArray[np.int64]
    point_cross: NDArray[np.float64]
    point_prior: NDArray[np.float64]

    @property
    def n_owners(self) -> int:
        """K."""
        return len(self.owners)

    @property
    def p(self) -> int:
        """The summary's size."""
        return int(self.point_owner.shape[0])

    @classmethod
    def from_summary(
        cls,
        points: ArrayLike,
        owner_ids: Sequence[str],
        validation: ArrayLike,
        gamma: float,
        *,
        owners: Sequence[str] | None = None,
    ) -> SummaryBlocks:
        """Compute the blocks of a summary against a validation set.

        Parameters
        ----------
        points : array-like of shape (p, n_features)
            The delivered summary ``S`` (seed set excluded), in the order the points were added.
        owner_ids : sequence of str, length p
            The owner of each point.
        validation : array-like of shape (m, n_features)
            ``D_v``.
        gamma : float
            The session's RBF kernel parameter, > 0.
        owners : sequence of str, optional
            Every owner of the session, in the order attributions list them; owners with no
            delivered point get value 0 under every rule. Default: the owners of ``owner_ids``
            in order of first appearance.

        Returns
        -------
        SummaryBlocks

        Raises
        ------
        ValueError
            If a set is empty, not 2-D or holds NaN or inf, the feature counts differ, ``gamma``
            is not a finite number > 0, ``owner_ids`` does not have one entry per point, names an
            owner not in ``owners``, or ``owners`` repeats a name.

        Notes
        -----
        Cost: ``p m + p^2`` kernel evaluations (of the ``p x p`` block only the lower triangle is
        summed), in blocks of at most 2,048 rows.
        """
        s = check_matrix(points, "summary")
        v = check_matrix(validation, "validation set", n_features=s.shape[1])
        ids = [str(i) for i in owner_ids]
        if len(ids) != s.shape[0]:
            raise ValueError(
                f"owner_ids must name the owner of each of the {s.shape[0]} points, "
                f"got {len(ids)} names"
            )
        names = tuple(dict.fromkeys(ids)) if owners is None else tuple(str(o) for o in owners)
        if len(set(names)) != len(names):
            raise ValueError(f"owners must not repeat a name, got {list(names)}")
        index = {name: k for k, name in enumerate(names)}
        unknown = sorted(set(ids) - set(index))
        if unknown:
            raise ValueError(
                f"owner_ids name owner(s) {unknown} that are not in owners {list(names)}"
            )
        point_owner = np.array([index[i] for i in ids], dtype=np.int64)
        p, k_owners = s.shape[0], len(names)
        point_cross = np.zeros(p, dtype=np.float64)
        for start in range(0, v.shape[0], _CHUNK):
            point_cross += rbf_kernel(v[start : start + _CHUNK], s, gamma).sum(axis=0)
        point_prior = np.zeros(p, dtype=np.float64)
        within = np.zeros((k_owners, k_owners), dtype=np.float64)
        one_hot = np.zeros((p, k_owners), dtype=np.float64)
        one_hot[np.arange(p), point_owner] = 1.0
        for start in range(0, p, _CHUNK):
            stop = min(start + _CHUNK, p)
            block = rbf_kernel(s[start:stop], s[:stop], gamma)
            rows = np.arange(stop - start)
            block[rows, start + rows] = 1.0  # k(x, x) = 1 exactly
            lower = np.tril(block, k=start - 1)  # columns t < i
            point_prior[start:stop] = lower.sum(axis=1)
            # B_jl over pairs (i, t) with t < i; both orders and the diagonal are added below.
            within += one_hot[start:stop].T @ lower @ one_hot[:stop]
        within = within + within.T
        counts = np.bincount(point_owner, minlength=k_owners).astype(np.int64)
        within[np.diag_indices(k_owners)] += counts
        cross = np.bincount(point_owner, weights=point_cross, minlength=k_owners)
        return cls(
            owners=names,
            m=int(v.shape[0]),
            counts=counts,
            cross=cross.astype(np.float64),
            within=within,
            point_owner=point_owner,
            point_cross=point_cross,
            point_prior=point_prior,
        )


# ----------------------------------------------------------------------------------------- games
class SummaryGame(ABC):
    """A cooperative game on the owners, valued from a summary's :class:`SummaryBlocks`.

    Subclasses give :meth:`value_of` ``(n_C, A_C, B_C) -> u(C)`` with ``u(empty) = 0``.

    Parameters
    ----------
    blocks : SummaryBlocks
    """

    #: Short name, recorded in every :class:`Attribution`.
    name: str = ""

    def __init__(self, blocks: SummaryBlocks) -> None:
        self.blocks = blocks

    @abstractmethod
    def value_of(
        self, n: NDArray[np.float64], cross: NDArray[np.float64], within: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """``u`` of coalitions given their ``n_C``, ``A_C`` and ``B_C`` (arrays of one shape).

        Returns 0 where ``n_C = 0``.
        """

    def values(self, masks: ArrayLike) -> NDArray[np.float64]:
        """``u(C)`` for coalitions given as rows of a 0/1 matrix.

        Parameters
        ----------
        masks : array-like of shape (n_coalitions, K), 0/1 or bool
            Row c marks the owners of coalition c.

        Returns
        -------
        ndarray of shape (n_coalitions,), float64

        Raises
        ------
        ValueError
            If ``masks`` does not have K columns.
        """
        bits = np.asarray(masks, dtype=np.float64)
        if bits.ndim != 2 or bits.shape[1] != self.blocks.n_owners:
            raise ValueError(
                f"masks must have shape (n_coalitions, {self.blocks.n_owners}), got {bits.shape}"
            )
        b = self.blocks
        n = bits @ b.counts.astype(np.float64)
        a = bits @ b.cross
        w = np.einsum("ij,ij->i", bits @ b.within, bits)
        return self.value_of(n, a, w)

    def grand_value(self) -> float:
        """``u(N)``, the value of the whole summary."""
        return float(self.values(np.ones((1, self.blocks.n_owners)))[0])


class ObjectiveGame(SummaryGame):
    """``v(C) = J(S_C)``, the paper's normalized MMD objective (Eq. 3) on the coalition's points.

    ``v(C) = 2 A_C / (m n_C) - B_C / n_C^2`` for ``n_C >= 1``, ``v(C) = 0`` for ``n_C = 0``. In
    [-1, 1]: a single point far from ``D_v`` has ``J = 2 mean_v k(v, x) - 1 ~ -1``, so the value of
    a coalition may be negative, and so may an owner's attribution.

    References
    ----------
    Summarization paper, Eq. 3.
    """

    name = "objective"

    def value_of(
        self, n: NDArray[np.float64], cross: NDArray[np.float64], within: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """See :meth:`SummaryGame.value_of`."""
        safe = np.maximum(n, 1.0)
        out = 2.0 * cross / (self.blocks.m * safe) - within / (safe * safe)
        return np.where(n > 0, out, 0.0)


class EmbeddingGame(SummaryGame):
    """The objective on the coalition's part of the summary's mean embedding (the payout game).

    With ``phi`` the kernel's feature map, ``mu_V = mean_{v in D_v} phi(v)`` and the
    coalition's part of the summary's mean embedding ``mu_C = (1 / p) sum_{x in S_C} phi(x)``
    (its points keep the weight ``1 / p`` they have in ``S``)::

        e(C) = 2 <mu_V, mu_C> - ||mu_C||^2 = 2 A_C / (m p) - B_C / p^2,

    so ``e(N) = ||mu_V||^2 - MMD^2(D_v, S) = J(S)`` and ``e(empty) = 0``. Unlike ``J(S_C)`` it
    does not re-normalise a small coalition's points to a whole summary (a lone point is not
    judged as a one-point summary, ``J({x}) = 2 mean_v k(v, x) - 1``), which is what makes its
    Shapley values cheap and of low sensitivity.

    The game is quadratic in the owners' parts ``mu_j``, so its Shapley values have a closed
    form (:func:`embedding_shapley`): each pair's interaction ``<mu_j, mu_l>`` is split evenly,
    ``phi_j = <mu_j, 2 mu_V - mu_S> = (1 / p) sum_{x in S_j} (2 mean_{v} k(v, x) - mean_{y in S}
    k(x, y))``, each point's closeness to ``D_v`` less its redundancy with the whole summary.

    Notes
    -----
    This is the utility of the private payouts; its sensitivities are derived in
    :mod:`dpmarket.common.market.payouts` (``2 / m`` in L1 over all owners for a replaced
    validation point; ``(p - 1) / p^2`` in L1 over the other owners for a replaced delivered
    point).
    """

    name = "embedding"

    def value_of(
        self, n: NDArray[np.float64], cross: NDArray[np.float64], within: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """See :meth:`SummaryGame.value_of` (``n`` is not needed: ``A`` and ``B`` are 0 when
        ``n`` is)."""
        b = self.blocks
        p = max(b.p, 1)
        out: NDArray[np.float64] = 2.0 * cross / (b.m * p) - within / (p * p)
        return out


def embedding_shapley(blocks: SummaryBlocks) -> Attribution:
    """The exact Shapley values of :class:`EmbeddingGame`, in closed form.

    ``phi_j = 2 a_j / (m p) - (sum_l B_jl) / p^2``.

    Parameters
    ----------
    blocks : SummaryBlocks

    Returns
    -------
    Attribution
        ``rule="shapley-exact"``, ``game="embedding"``.

    Notes
    -----
    ``e(C) = sum_{j in C} 2 a_j / (m p) - sum_{j, l in C} B_jl / p^2`` is a sum of an additive
    game and of pair games ``-B_jl / p^2`` (``j != l``, counted twice) and ``-B_jj / p^2``. The
    Shapley value of an additive game is its own term; a pair game is symmetric in its two
    owners and null for every other, so each of the two gets half of it. Summing: ``phi_j =
    2 a_j / (m p) - B_jj / p^2 - sum_{l != j} B_jl / p^2``. Efficiency, symmetry, null owner:
    yes (Shapley values; the tests check the closed form against :func:`exact_shapley`). Cost:
    ``O(K^2)`` after the blocks, whatever K.
    """
    p = max(blocks.p, 1)
    values = 2.0 * blocks.cross / (blocks.m * p) - blocks.within.sum(axis=1) / (p * p)
    total = float(values.sum())
    return Attribution(blocks.owners, values, "shapley-exact", EmbeddingGame.name, total)


# -------------------------------------------------------------------------------------- results
@dataclass(frozen=True)
class Attribution:
    """Each owner's value under one rule and one game.

    Attributes
    ----------
    owners : tuple of str, length K
    values : ndarray of shape (K,), float64
        In the game's units (``J`` is dimensionless, in [-1, 1] for a coalition).
    rule : {"paper-rule", "shapley-exact", "shapley-sampled", "leave-one-out", "shapley-own"}
    game : str
        The game's name (``"objective"``, ``"embedding"``).
    total : float
        ``u(N)``: the values sum to it under every rule but leave-one-out.
    standard_errors : ndarray of shape (K,), float64, or None
        Sampled Shapley only: the standard error of each value (0 for an owner with no point).
    n_permutations : int
        Sampled Shapley only: permutations walked (0 otherwise).
    """

    owners: tuple[str, ...]
    values: NDArray[np.float64]
    rule: AttributionRule
    game: str
    total: float
    standard_errors: NDArray[np.float64] | None = None
    n_permutations: int = 0

    def as_dict(self) -> dict[str, float]:
        """Owner name -> value."""
        return {o: float(x) for o, x in zip(self.owners, self.values, strict=True)}


# ---------------------------------------------------------------------------------------- rules
def paper_rule(game: SummaryGame) -> Attribution:
    """The paper's rule: each owner's sum of its points' marginal gains in the greedy order.

    With ``S_i`` the first ``i`` points in the order the curator added them (``S_0`` empty,
    ``u(S_0) = 0``), point ``i`` gains ``u(S_i) - u(S_{i-1})`` and owner ``j`` gets the sum of
    the gains of its points. With :class:`ObjectiveGame` the gain is ``J(S_i) - J(S_{i-1})``,
    Section 2's "sum of winning marginal bids from the source".

    Parameters
    ----------
    game : SummaryGame
        Valued on point prefixes through the same ``(n, A, B)`` formula as on coalitions.

    Returns
    -------
    Attribution
        ``rule="paper-rule"``.

    Notes
    -----
    Efficiency: yes, the gains telescope to ``u(S_p) - u(S_0) = u(N)``. Null owner: yes, an owner
    with no point gets an empty sum. Symmetry: no, the rule depends on the order: of two owners
    holding identical points, the one whose points were added first is paid for the coverage the
    second one's duplicates then lack (under diminishing returns the first gets more). Cost:
    ``O(p)`` after the blocks.
    """
    b = game.blocks
    i = np.arange(1, b.p + 1, dtype=np.float64)
    prefix = game.value_of(i, np.cumsum(b.point_cross), np.cumsum(2.0 * b.point_prior + 1.0))
    gains = np.diff(np.concatenate([[0.0], prefix]))
    values = np.bincount(b.point_owner, weights=gains, minlength=b.n_owners)
    return Attribution(
        b.owners,
        values.astype(np.float64),
        "paper-rule",
        game.name,
        float(prefix[-1]) if b.p else 0.0,
    )


def _shapley_weights(k: int) -> NDArray[np.float64]:
    """``|C|! (K - |C| - 1)! / K!`` for ``|C| = 0 .. K - 1``."""
    s = np.arange(k)
    return np.array([1.0 / (k * math.comb(k - 1, int(c))) for c in s])


def exact_shapley(game: SummaryGame) -> Attribution:
    """The owners' Shapley values, exactly, by enumerating every coalition.

    ``phi_j = sum_{C not containing j} |C|! (K - |C| - 1)! / K! (u(C + j) - u(C))``.

    Parameters
    ----------
    game : SummaryGame

    Returns
    -------
    Attribution
        ``rule="shapley-exact"``.

    Raises
    ------
    ValueError
        If the game has more than :data:`MAX_EXACT_OWNERS` owners (use :func:`sampled_shapley`).

    Notes
    -----
    Efficiency, symmetry and null owner: yes (Shapley's axioms; the tests check them against a
    brute-force sum over permutations). Cost: the ``2^K`` coalitions' block sums are built by
    doubling (coalition ``C + i`` from ``C``, for ``C`` over the owners before ``i``: ``n``, ``A``
    and ``B`` grow by ``n_i``, ``a_i`` and ``2 sum_{l in C} B_il + B_ii``), ``O(2^K)``
    arithmetic each and no kernel evaluation; then ``O(2^K K)`` for the sums. Memory ``O(2^K)``
    floats (K = 16: 65,536 coalitions, milliseconds; K = 20: about 50 MiB).
    """
    b = game.blocks
    k = b.n_owners
    if k > MAX_EXACT_OWNERS:
        raise ValueError(
            f"exact Shapley values enumerate 2^K coalitions; K = {k} is more than "
            f"{MAX_EXACT_OWNERS}: use sampled_shapley"
        )
    total = 1 << k
    n = np.zeros(total)
    cross = np.zeros(total)
    within = np.zeros(total)
    sizes = np.zeros(total, dtype=np.int64)
    for i in range(k):
        low, high = slice(0, 1 << i), slice(1 << i, 2 << i)
        row = np.zeros(1 << i)  # sum_{l in C} B_il for the coalitions C of owners 0 .. i - 1
        for j in range(i):
            row[1 << j : 2 << j] = row[: 1 << j] + b.within[i, j]
        n[high] = n[low] + b.counts[i]
        cross[high] = cross[low] + b.cross[i]
        within[high] = within[low] + 2.0 * row + b.within[i, i]
        sizes[high] = sizes[low] + 1
    values = game.value_of(n, cross, within)
    weights = np.append(_shapley_weights(k), 0.0)[sizes]
    phi = np.empty(k, dtype=np.float64)
    for j in range(k):
        # Coalitions in the order of their masks: bit j splits each block of 2^(j+1) in two.
        v = values.reshape(-1, 2, 1 << j)
        w = weights.reshape(-1, 2, 1 << j)[:, 0, :]
        phi[j] = float(np.sum(w * (v[:, 1, :] - v[:, 0, :])))
    return Attribution(b.owners, phi, "shapley-exact", game.name, float(values[-1]))


def sampled_shapley(
    game: SummaryGame,
    n_permutations: int,
    rng: np.random.Generator,
    *,
    antithetic: bool = True,
) -> Attribution:
    """The owners' Shapley values estimated from random permutations, with standard errors.

    Each permutation ``pi`` of the owners gives every owner its marginal contribution
    ``u(Pre_pi(j) + j) - u(Pre_pi(j))``; the estimate is their mean (Castro et al., 2009). With
    ``antithetic=True`` the permutations come in pairs ``pi``, ``reversed(pi)`` (Mitchell et al.,
    2022): an owner early in one is late in the other, which cancels most of the variance that
    position causes in games with diminishing returns such as these.

    Parameters
    ----------
    game : SummaryGame
    n_permutations : int
        Permutations to walk, >= 2 (rounded up to an even number when antithetic).
    rng : numpy.random.Generator
        Draws the permutations.
    antithetic : bool
        Pair each permutation with its reverse.

    Returns
    -------
    Attribution
        ``rule="shapley-sampled"``, with ``standard_errors``: the sample standard deviation of
        the per-permutation (per-pair when antithetic) contributions over the square root of their
        number.

    Raises
    ------
    ValueError
        If ``n_permutations`` is not an integer >= 2.

    Notes
    -----
    Efficiency: yes, exactly: every permutation's contributions telescope to ``u(N)``. Null owner:
    yes, exactly (its contribution is 0 in every permutation). Symmetry: in expectation (the
    estimator is unbiased). Cost: ``O(P K^2)`` for P permutations (each step adds one owner's
    row of ``B`` to a running vector), vectorised over batches of 1,024 permutations; no kernel
    evaluation.
    """
    n_perm = check_positive_int(n_permutations, "n_permutations")
    if n_perm < 2:
        raise ValueError(f"n_permutations must be >= 2 (a standard error needs two), got {n_perm}")
    b = game.blocks
    k = b.n_owners
    groups = (n_perm + 1) // 2 if antithetic else n_perm
    per_group = 2 if antithetic else 1
    contributions = np.empty((groups, k), dtype=np.float64)
    counts = b.counts.astype(np.float64)
    for start in range(0, groups, _PERMUTATIONS):
        size = min(_PERMUTATIONS, groups - start)
        perms = rng.permuted(np.tile(np.arange(k), (size, 1)), axis=1)
        if antithetic:
            perms = np.concatenate([perms, perms[:, ::-1]])
        marg = _walk(game, perms, counts)
        if antithetic:
            marg = 0.5 * (marg[:size] + marg[size:])
        contributions[start : start + size] = marg
    phi = contributions.mean(axis=0)
    se = contributions.std(axis=0, ddof=1) / math.sqrt(groups) if groups > 1 else np.zeros(k)
    return Attribution(
        b.owners,
        phi,
        "shapley-sampled",
        game.name,
        game.grand_value(),
        standard_errors=se,
        n_permutations=groups * per_group,
    )


def _walk(
    game: SummaryGame, perms: NDArray[np.int64], counts: NDArray[np.float64]
) -> NDArray[np.float64]:
    """Marginal contributions of every owner along every permutation, shape (P, K)."""
    b = game.blocks
    n_perm, k = perms.shape
    rows = np.arange(n_perm)
    n = np.zeros(n_perm)
    a = np.zeros(n_perm)
    w = np.zeros(n_perm)
    row_sums = np.zeros((n_perm, k))  # sum_{l in coalition} B_{., l}
    previous = np.zeros(n_perm)
    out = np.empty((n_perm, k))
    for t in range(k):
        j = perms[:, t]
        w = w + 2.0 * row_sums[rows, j] + b.within[j, j]
        n = n + counts[j]
        a = a + b.cross[j]
        current = game.value_of(n, a, w)
        out[rows, j] = current - previous
        previous = current
        row_sums += b.within[j]
    return out


def leave_one_out(game: SummaryGame) -> Attribution:
    """Each owner's leave-one-out value ``u(N) - u(N - j)``.

    Parameters
    ----------
    game : SummaryGame

    Returns
    -------
    Attribution
        ``rule="leave-one-out"``; ``total`` is ``u(N)``, which the values need not sum to.

    Notes
    -----
    Symmetry and null owner: yes. Efficiency: no; with near-duplicate owners each one's
    leave-one-out value is near 0 (the other covers for it) however much both are worth
    together. Cost: ``K + 1`` coalitions, ``O(K^3)``.
    """
    b = game.blocks
    k = b.n_owners
    masks = np.ones((k + 1, k))
    masks[np.arange(k), np.arange(k)] = 0.0
    values = game.values(masks)
    return Attribution(
        b.owners, values[-1] - values[:-1], "leave-one-out", game.name, float(values[-1])
    )


# ------------------------------------------------------------------------- the own-data part
@dataclass(frozen=True)
class OwnWeights:
    """Moments of an owner's coalition size over a uniformly random order of the owners.

    For owner ``j`` and a uniformly random order of the K owners, ``N_j`` is the number of
    delivered points of ``j`` and of the owners before it (``n_j`` plus a random subset sum of
    the others' counts, each subset size equally likely, as in the Shapley value). Functions of
    the counts alone. Owners with ``n_j = 0`` get 0 in every array.

    Attributes
    ----------
    inverse : ndarray of shape (K,), float64
        ``E[1 / N_j]``.
    inverse_square : ndarray of shape (K,), float64
        ``E[1 / N_j^2]``.
    count_term : ndarray of shape (K,), float64
        ``E[1 / (N_j - n_j) - 1 / N_j]`` with ``1 / 0 := 0`` (the first owner of an order has
        nothing before it): owner j's Shapley value of the count-only game ``-1 / n_C``
        (``-1 / 0 := 0``), the diagonal ``k(x, x) = 1`` of ``J``'s redundancy term.
    """

    inverse: NDArray[np.float64]
    inverse_square: NDArray[np.float64]
    count_term: NDArray[np.float64]


def own_weights(counts: ArrayLike) -> OwnWeights:
    """The moments of :class:`OwnWeights` for delivered counts ``n_1 .. n_K``, exactly.

    Parameters
    ----------
    counts : array-like of int, shape (K,)
        Delivered points per owner, >= 0.

    Returns
    -------
    OwnWeights

    Raises
    ------
    ValueError
        If a count is negative or not an integer.

    Notes
    -----
    For each owner, a table ``T[s, t]`` of the subsets of the other owners with ``s`` owners and
    ``t`` points (dynamic programming over the owners, ``O(K p)`` per owner); a subset of size
    ``s`` comes before ``j`` with probability ``1 / (K binom(K - 1, s))``. Cost ``O(K^3 p)``
    arithmetic, no kernel evaluation: under a millisecond at K = 16, p = 200, and polynomial in
    K (no ``2^K``).
    """
    n = np.asarray(counts)
    if n.ndim != 1 or (n.size and (not np.issubdtype(n.dtype, np.integer) or n.min() < 0)):
        raise ValueError(f"counts must be a 1-D array of integers >= 0, got {counts!r}")
    k = int(n.size)
    inverse, inverse_square, count_term = np.zeros(k), np.zeros(k), np.zeros(k)
    total = int(n.sum())
    weight = np.array([1.0 / (k * math.comb(k - 1, s)) for s in range(k)]) if k else np.zeros(0)
    for j in range(k):
        nj = int(n[j])
        if nj == 0:
            continue
        others = [int(c) for i, c in enumerate(n) if i != j]
        rest = total - nj
        table = np.zeros((k, rest + 1))
        table[0, 0] = 1.0
        for c in others:
            if c:
                table[1:, c:] = table[1:, c:] + table[:-1, : rest + 1 - c]
            else:
                table[1:] = table[1:] + table[:-1]
        mass = (table * weight[:, None]).sum(axis=0)  # P(the owners before j hold t points)
        t = np.arange(rest + 1, dtype=np.float64)
        big = t + nj
        inverse[j] = float(mass @ (1.0 / big))
        inverse_square[j] = float(mass @ (1.0 / big**2))
        before = np.where(t > 0, 1.0 / np.maximum(t, 1.0), 0.0)
        count_term[j] = float(mass @ (before - 1.0 / big))
    return OwnWeights(inverse, inverse_square, count_term)


def own_shapley(blocks: SummaryBlocks, *, weights: OwnWeights | None = None) -> Attribution:
    """Each owner's own-data part of its Shapley value of ``v(C) = J(S_C)``.

    Write ``J(S_C) = 2 A_C / (m n_C) - 1 / n_C - (B_C - n_C) / n_C^2`` (closeness, the kernel's
    diagonal, redundancy between distinct points). Owner j's marginal contribution to a
    coalition ``C`` before it involves its own closeness ``a_j``, its own redundancy ``B_jj -
    n_j``, the counts, and the other owners' data (their closeness ``a_l``, diluted by j's
    points, and the redundancy ``B_jl``, ``B_ll'``). Keeping the first three and dropping the
    last, in expectation over a uniformly random order of the owners (:class:`OwnWeights`)::

        psi_j = (2 a_j / m) E[1 / N_j] - (B_jj - n_j) E[1 / N_j^2]
                + E[1 / (N_j - n_j) - 1 / N_j],

    the last term being j's Shapley value of the count-only game ``-1 / n_C`` (``1 / 0 :=
    0``). With one delivering owner ``psi = J(S)``. ``psi_j = 0`` for an owner with no
    delivered point.

    Parameters
    ----------
    blocks : SummaryBlocks
    weights : OwnWeights, optional
        ``own_weights(blocks.counts)``, if the caller has them already.

    Returns
    -------
    Attribution
        ``rule="shapley-own"``, ``game="objective"``; ``total`` is ``J(S)``, which the values
        need not sum to.

    Notes
    -----
    Symmetry: yes (two owners with the same count, closeness and own redundancy get the same
    value; in particular owners with identical points). Null owner: yes (an owner with no
    delivered point gets exactly 0). Efficiency: no: the dropped terms do not sum to 0 across
    owners. Rank agreement with ``v``'s exact Shapley values: measured by ``dpmarket lab
    evaluate --attribution`` (docs/results.md, "The market"). What it buys: no owner's value
    reads another owner's points, so its release costs the owners nothing (the Notes of
    :mod:`dpmarket.common.market.payouts`). Cost: :func:`own_weights` plus ``O(K)``.
    """
    w = own_weights(blocks.counts) if weights is None else weights
    own = np.diag(blocks.within) - blocks.counts
    values = 2.0 * blocks.cross / blocks.m * w.inverse - own * w.inverse_square + w.count_term
    values = np.where(blocks.counts > 0, values, 0.0)
    total = ObjectiveGame(blocks).grand_value()
    return Attribution(blocks.owners, values, "shapley-own", ObjectiveGame.name, total)
