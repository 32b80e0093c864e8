"""What any private release can reach against ``J(S_C)``'s exact Shapley values, per scenario.

The goal of ``dpmarket lab evaluate --attribution`` is a Spearman correlation >= 0.9 between the
private payouts (epsilon 1) and the exact Shapley values ``phi`` of the paper's game ``v(C) =
J(S_C)`` (:class:`~dpmarket.common.market.ObjectiveGame`). This module measures, for one
delivered summary, how far any epsilon-DP release (with respect to one replaced point of the
validation set ``D_v``, the summary held fixed, as every payout release of
:mod:`dpmarket.common.market.payouts` is) can go:

* **The closeness map.** ``v(C) = 2 A_C / (m n_C) - B_C / n_C^2`` and only ``A_C = sum_{j in
  C} a_j`` reads ``D_v``; Shapley values are linear in the game, so ``phi = (2 / m) W a + c``
  with ``W`` (K x K) the Shapley values of the games ``C -> [j in C] / n_C`` (a function of the
  public counts, :func:`closeness_map`) and ``c`` free of ``D_v``.
* **Its sensitivity** (:func:`validation_sensitivity`): one replaced validation point moves
  ``a_j`` by ``delta_j = sum_{x in S_j} (k(v', x) - k(v, x))`` in ``(-n_j, n_j)``, so
  ``phi`` by ``(2 / m) W delta``; its L1 sensitivity is the largest ``||(2 / m) W diag(n)
  s||_1`` over sign vectors ``s`` (a convex function's maximum over a box is at a vertex).
  Every vertex is approached by some data (the owners of ``s = +1`` at one place, those of ``s
  = -1`` at another, ``v'`` at the first and ``v`` at the second), so no Laplace release of
  ``phi`` for every summary with these counts may use less.
* **The oracle** (:func:`oracle_spearman`): ``phi`` itself plus Laplace noise of that scale on
  the delivering owners (the null owners are known to be 0): the best any Laplace release of
  the reference values can rank, ignoring the noise the other owners' points would add (their
  sensitivity is larger still). Optimistic: a bound on our releases, not on every mechanism.
* **The bound on every mechanism** (:func:`dp_rank_bound`, :func:`flip_search`): if replacing
  ``k`` validation points by points of the data turns ``phi`` into ``phi'`` with Spearman
  ``rho'`` between them, no epsilon-DP mechanism (whatever it releases and however it pays)
  has mean Spearman above :func:`dp_rank_bound` ``(k epsilon, rho')`` against both ``phi`` on
  ``D_v`` and ``phi'`` on the neighbour. :func:`flip_search` looks greedily (one, then a
  second replacement) for the neighbour that moves the ranking most.

References
----------
Dwork & Roth (2014), "The Algorithmic Foundations of Differential Privacy", Section 3.3 (the
Laplace mechanism), Section 2.3 (group privacy); Shapley (1953) (linearity).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import rankdata

from dpmarket.common.market import ObjectiveGame, SummaryBlocks, exact_shapley
from dpmarket.common.summarization.kernels import rbf_kernel

__all__ = [
    "LIMIT_EPSILONS",
    "Flip",
    "closeness_map",
    "dp_rank_bound",
    "flip_search",
    "measure_limits",
    "oracle_spearman",
    "owner_sensitivity",
    "owner_sums",
    "validation_sensitivity",
]

#: The payout epsilons of the limits: the goal's, and one where the noise is negligible.
LIMIT_EPSILONS: tuple[float, ...] = (1.0, 1000.0)
#: Validation points tried at once by :func:`flip_search` (bounds memory to this times the
#: candidates times K floats).
_ROWS = 64


def closeness_map(blocks: SummaryBlocks) -> NDArray[np.float64]:
    """``W`` with ``phi = (2 / m) W a + c``: the Shapley values of ``C -> [j in C] / n_C``.

    Parameters
    ----------
    blocks : SummaryBlocks
        Only its counts are read.

    Returns
    -------
    ndarray of shape (K, K), float64
        Column ``j``: the owners' exact Shapley values of the game ``C -> [j in C] / n_C``
        (``0`` for ``n_C = 0``); rows and columns of owners with no delivered point are 0.

    Notes
    -----
    ``v(C) = 2 A_C / (m n_C) - B_C / n_C^2`` with ``A_C = sum_{j in C} a_j``; Shapley values are
    linear in the game, so ``phi = sum_j (2 a_j / m) W[:, j] + phi(-B_C / n_C^2)``. Cost: K
    exact Shapley computations, ``O(2^K K^2)`` each.
    """
    k = blocks.n_owners
    out = np.zeros((k, k))
    zero = np.zeros((k, k))
    for j in np.flatnonzero(blocks.counts > 0):
        unit = np.zeros(k)
        unit[j] = blocks.m / 2.0  # 2 A_C / (m n_C) = [j in C] / n_C
        out[:, j] = exact_shapley(ObjectiveGame(replace(blocks, cross=unit, within=zero))).values
    return out


def validation_sensitivity(blocks: SummaryBlocks, w: NDArray[np.float64]) -> float:
    """The L1 sensitivity of ``J(S_C)``'s Shapley values to one replaced validation point.

    Parameters
    ----------
    blocks : SummaryBlocks
    w : ndarray of shape (K, K)
        :func:`closeness_map` of ``blocks``.

    Returns
    -------
    float
        ``max_s ||(2 / m) W diag(n) s||_1`` over ``s`` in ``{-1, 1}^K`` (delivering owners).

    Notes
    -----
    Replacing ``v`` by ``v'`` moves ``a_j`` by ``delta_j = sum_{x in S_j} (k(v', x) - k(v,
    x))``, each term in ``(-1, 1)`` since ``k`` is in ``(0, 1]``: ``delta`` ranges over the box
    ``(-n, n)``, and ``phi`` moves by ``(2 / m) W delta`` (the summary, hence the counts, held
    fixed). The L1 norm of a linear map is convex, so its supremum over the box is at a vertex
    ``diag(n) s``; each vertex is approached by data (module docstring). Cost: ``2^{K'}`` sign
    vectors for K' delivering owners (65,536 at K' = 16).
    """
    active = np.flatnonzero(blocks.counts > 0)
    if active.size == 0:
        return 0.0
    cols = w[:, active] * blocks.counts[active]
    signs = 1.0 - 2.0 * ((np.arange(1 << active.size)[:, None] >> np.arange(active.size)) & 1)
    return float(2.0 / blocks.m * np.abs(signs @ cols.T).sum(axis=1).max())


def owner_sensitivity(blocks: SummaryBlocks, w: NDArray[np.float64]) -> float:
    """A lower bound on the L1 sensitivity of the other owners' values of ``J(S_C)`` to one
    delivered point.

    Parameters
    ----------
    blocks : SummaryBlocks
    w : ndarray of shape (K, K)
        :func:`closeness_map` of ``blocks``.

    Returns
    -------
    float
        ``max_l 2 sum_{i != l} |W_il|`` over delivering owners ``l``.

    Notes
    -----
    Let every validation point sit at one place, owner ``l``'s point ``x`` far from it and from
    every other point, and ``x'`` at it: ``a_l`` grows by ``m`` (up to the kernel's tail) and
    no ``B`` changes but through the diagonal, which is the same (the counts held fixed), so
    ``phi`` moves by ``(2 / m) W[:, l] m``. Owner ``l`` learns its own value from its own data;
    the others' values, which every other owner may pool, move by ``2 sum_{i != l} |W_il|``,
    so no Laplace release of them private for ``l``'s points may use less. The upper bound
    (every way a point can move ``A`` and ``B``) is larger.
    """
    active = np.flatnonzero(blocks.counts > 0)
    if active.size < 2:
        return 0.0
    off = np.abs(w[:, active]).sum(axis=0) - np.abs(w[active, active])
    return float(2.0 * off.max())


def oracle_spearman(
    phi: NDArray[np.float64],
    active: NDArray[np.bool_],
    scale: float,
    draws: int,
    rng: np.random.Generator,
) -> float:
    """Mean Spearman of ``phi + Lap(scale)`` (delivering owners; the others exactly 0) with
    ``phi``, over ``draws`` draws."""
    noisy = np.repeat(phi[None, :], draws, axis=0)
    noisy[:, active] += rng.laplace(0.0, scale, size=(draws, int(active.sum())))
    return float(np.mean(_spearman_rows(noisy, phi)))


def dp_rank_bound(t: float, rho: float) -> float:
    """The most mean Spearman any ``t``-DP pair of output distributions reaches on both sides.

    Parameters
    ----------
    t : float
        The privacy loss between the two datasets (``k epsilon`` for ``k`` replaced points).
    rho : float
        Spearman between the two datasets' reference rankings ``phi`` and ``phi'``.

    Returns
    -------
    float
        ``sqrt(e^{2t} + 2 e^t rho + 1) / (1 + e^t)``: an upper bound on ``min(E_D[rho(M,
        phi)], E_{D'}[rho(M, phi')])`` for every mechanism ``M`` that is ``t``-DP between ``D``
        and ``D'``.

    Notes
    -----
    Spearman is the cosine of centred rank vectors, so an output's pair ``(rho(x, phi),
    rho(x, phi'))`` lies in the projection of the unit ball on the plane of ``u = phi``'s and
    ``u' = phi'``'s unit rank vectors, ``cos theta_0 = rho``. Moving each output to the arc
    ``(cos theta, cos(theta_0 - theta))`` along ``(1, 1)`` raises both and is a post-processing
    that commutes with swapping the datasets, so an optimal pair is symmetric (``Q`` is ``P``
    mirrored) and lives on the arc. DP bounds the mass of ``theta`` against that of ``theta_0 -
    theta`` by ``e^t`` either way; the best pair puts ``e^t / (1 + e^t)`` on the nearer side:
    ``max_theta (e^t cos theta + cos(theta_0 - theta)) / (1 + e^t)``, a sinusoid's amplitude.
    Below 0.9 at ``t = 1`` for ``rho < 0.517``, at ``t = 2`` for ``rho < 0.095``; never at
    ``t >= 3``.
    """
    u = math.exp(-t)  # the same ratio divided by e^t, finite for any t >= 0
    return math.sqrt(1.0 + 2.0 * u * rho + u * u) / (1.0 + u)


@dataclass(frozen=True)
class Flip:
    """The neighbours of ``D_v`` found by :func:`flip_search`: ``rho[k - 1]`` is Spearman
    between ``phi`` and the values after the first ``k`` of ``moves``, each ``(r, c)``: the
    validation point of index ``r`` replaced by the candidate of index ``c``."""

    rho: tuple[float, ...]
    moves: tuple[tuple[int, int], ...]

    def bound(self, epsilon: float) -> float:
        """The least :func:`dp_rank_bound` over the neighbours at ``epsilon`` per point."""
        return min(dp_rank_bound(k * epsilon, r) for k, r in enumerate(self.rho, start=1))


def flip_search(
    phi: NDArray[np.float64],
    w: NDArray[np.float64],
    m: int,
    validation_sums: NDArray[np.float64],
    candidate_sums: NDArray[np.float64],
    steps: int = 2,
) -> Flip:
    """Greedy: the replacements of validation points that lower Spearman with ``phi`` most.

    Parameters
    ----------
    phi : ndarray of shape (K,)
        ``J(S_C)``'s exact Shapley values.
    w : ndarray of shape (K, K)
        :func:`closeness_map`.
    m : int
        ``|D_v|``.
    validation_sums : ndarray of shape (m, K)
        Row ``r``: ``sum_{x in S_j} k(v_r, x)`` per owner ``j``.
    candidate_sums : ndarray of shape (q, K)
        The same sums of the points a validation point may be replaced by (points of the
        data: the summary's and the validation set's).
    steps : int
        Replacements, one after the other, each the best against ``phi`` given the earlier.

    Returns
    -------
    Flip
    """
    scale = 2.0 / m
    moved_out = scale * validation_sums @ w.T  # (m, K)
    moved_in = scale * candidate_sums @ w.T  # (q, K)
    current, used, rhos, moves = phi.copy(), np.zeros(m, dtype=bool), [], []
    for _ in range(steps):
        best, best_at = 2.0, (0, 0)
        for start in range(0, m, _ROWS):
            rows = np.arange(start, min(start + _ROWS, m))
            moved = current[None, None, :] - moved_out[rows, None, :] + moved_in[None, :, :]
            rho = _spearman_rows(moved.reshape(-1, phi.size), phi).reshape(rows.size, -1)
            rho[used[rows]] = 2.0
            at = np.unravel_index(int(np.argmin(rho)), rho.shape)
            if rho[at] < best:
                best, best_at = float(rho[at]), (int(rows[at[0]]), int(at[1]))
        r, c = best_at
        current = current - moved_out[r] + moved_in[c]
        used[r] = True
        rhos.append(best)
        moves.append(best_at)
    return Flip(tuple(rhos), tuple(moves))


def _spearman_rows(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Spearman of each row of ``x`` with ``y`` (mean ranks for ties; 0 for a constant row)."""
    rx = rankdata(x, axis=1)
    ry = rankdata(y)
    rx -= rx.mean(axis=1, keepdims=True)
    ry = ry - ry.mean()
    norm = np.linalg.norm(rx, axis=1) * np.linalg.norm(ry)
    dot = rx @ ry
    return np.where(norm > 0, dot / np.where(norm > 0, norm, 1.0), 0.0)


def owner_sums(
    at: ArrayLike, points: ArrayLike, point_owner: NDArray[np.int64], k: int, gamma: float
) -> NDArray[np.float64]:
    """``sum_{x in S_j} k(y, x)`` for each row ``y`` of ``at`` and owner ``j``: shape (len, K)."""
    kernel = rbf_kernel(np.asarray(at, np.float64), np.asarray(points, np.float64), gamma)
    one_hot = np.zeros((point_owner.size, k))
    one_hot[np.arange(point_owner.size), point_owner] = 1.0
    return np.asarray(kernel @ one_hot, np.float64)


def measure_limits(
    blocks: SummaryBlocks,
    phi: NDArray[np.float64],
    points: ArrayLike,
    validation: ArrayLike,
    gamma: float,
    draws: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """One summary's limits at :data:`LIMIT_EPSILONS` (a JSON-ready record).

    Returns
    -------
    dict
        ``sensitivity``: :func:`validation_sensitivity`, in units of the embedding release's
        ``2 / m``; ``gap_min``, ``gap_median``: the least and the median gap between adjacent
        delivering owners' values over the oracle's noise scale at epsilon 1; ``close``: the
        share of those gaps below it; ``flip``: :attr:`Flip.rho`; ``bound``, ``oracle``:
        ``{epsilon: float}`` of :meth:`Flip.bound` and :func:`oracle_spearman`;
        ``owner_sensitivity``: :func:`owner_sensitivity` in the same units, and
        ``oracle_owners``: the oracle whose noise also covers it (the larger of the two).
    """
    w = closeness_map(blocks)
    sensitivity = validation_sensitivity(blocks, w)
    owner = owner_sensitivity(blocks, w)
    both = max(sensitivity, owner)
    active = blocks.counts > 0
    gaps = np.diff(np.sort(phi[active])) / sensitivity if sensitivity > 0 else np.zeros(0)
    validation_sums = owner_sums(validation, points, blocks.point_owner, blocks.n_owners, gamma)
    summary_sums = owner_sums(points, points, blocks.point_owner, blocks.n_owners, gamma)
    flip = flip_search(
        phi, w, blocks.m, validation_sums, np.concatenate([summary_sums, validation_sums])
    )
    keys = [f"{e:g}" for e in LIMIT_EPSILONS]
    return {
        "sensitivity": sensitivity * blocks.m / 2.0,
        "gap_min": float(gaps.min()) if gaps.size else 0.0,
        "gap_median": float(np.median(gaps)) if gaps.size else 0.0,
        "close": float(np.mean(gaps < 1.0)) if gaps.size else 0.0,
        "flip": list(flip.rho),
        "bound": {k: flip.bound(e) for k, e in zip(keys, LIMIT_EPSILONS, strict=True)},
        "oracle": {
            k: oracle_spearman(phi, active, sensitivity / e, draws, rng)
            for k, e in zip(keys, LIMIT_EPSILONS, strict=True)
        },
        "owner_sensitivity": owner * blocks.m / 2.0,
        "oracle_owners": {
            k: oracle_spearman(phi, active, both / e, draws, rng)
            for k, e in zip(keys, LIMIT_EPSILONS, strict=True)
        },
    }
