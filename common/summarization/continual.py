"""Continual release of a running sum by the binary-tree mechanism (Gaussian noise).

Used by the ``"rounds"`` summarization method to release the running summary embedding each round
(:mod:`dpmarket.curator.summarization.release`) instead of a fresh h2 (MWEM) release per round.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.privacy.noise import NoiseSource, SeededNoise
from dpmarket.common.validation import check_epsilon, check_positive_int, check_vector

__all__ = ["TreePrefixSum", "tree_levels"]


def tree_levels(horizon: int) -> int:
    """Number of tree nodes that can contain one increment: ``floor(log2(horizon)) + 1``.

    Parameters
    ----------
    horizon : int
        Most increments the tree will ever hold, ``>= 1``.

    Returns
    -------
    int
        ``horizon.bit_length()``: the levels ``j`` with ``2**j <= horizon``. A node of level ``j``
        covers ``2**j`` consecutive increments and is released once it is complete, so no node of
        a higher level ever is. This equals ``ceil(log2(horizon)) + 1`` when ``horizon`` is a power
        of two and is one less otherwise.

    Raises
    ------
    ValueError
        If ``horizon`` is not an integer ``>= 1``.
    """
    return check_positive_int(horizon, "horizon").bit_length()


class TreePrefixSum:
    """Binary-tree continual release of the prefix sums of a stream of vectors.

    Increments ``v_1, v_2, ...`` (at most ``horizon``) arrive one at a time. Node ``(j, k)`` of
    level ``j`` covers increments ``k 2**j + 1 .. (k + 1) 2**j``; when its last increment arrives
    the node is released once, as its exact sum plus ``N(0, sigma**2 I)`` noise drawn from ``rng``
    (independent per node). The released prefix sum of ``v_1 .. v_t`` is the sum of the noisy
    nodes of the dyadic decomposition of ``[1, t]`` (one per set bit of ``t``), a
    post-processing of the released nodes.

    Parameters
    ----------
    horizon : int
        Most increments, ``>= 1``.
    dimension : int
        Length ``d`` of every increment, ``>= 1``.
    sigma : float
        Standard deviation of the noise of every node and coordinate, ``> 0``, in the
        increments' units.
    rng : numpy.random.Generator
        Source of the node noise; ``d`` normal draws per completed node, in the order nodes
        complete (level 0 first).
    noise : NoiseSource, optional
        Source of the node noise instead (production: OpenDP's floating-point-safe sampler);
        default ``SeededNoise(rng)``, the same draws as ``rng.normal``.

    Raises
    ------
    ValueError
        If ``horizon`` or ``dimension`` is not an integer ``>= 1`` or ``sigma`` is not finite and
        ``> 0``.

    Notes
    -----
    Sensitivity. Let two streams differ in one increment ``v_t`` versus ``v_t'`` with
    ``||v_t - v_t'||_2 <= D``. The increment lies in exactly one node per level, so at most
    :attr:`levels` released nodes change, each by at most ``D`` in L2 norm. Releasing all nodes is
    therefore the composition of ``levels`` Gaussian mechanisms of L2 sensitivity ``D`` and noise
    ``sigma`` (equivalently one Gaussian mechanism of sensitivity ``D sqrt(levels)``); every
    prefix sum is post-processing. For h1 features (``||h1(x)||_2 <= sqrt(2)``) and the
    relation "replace one increment", ``D = 2 sqrt(2)``. The guarantee holds under adaptive
    choice of the increments (each increment may depend on earlier releases), since Gaussian PLDs
    compose adaptively.

    Accuracy. The noise of the prefix sum at ``t`` is the sum of ``popcount(t)`` independent nodes'
    noise, ``N(0, popcount(t) sigma**2 I)`` (:meth:`prefix_variance`), at most
    ``levels sigma**2`` per coordinate.

    References
    ----------
    Dwork, Naor, Pitassi & Rothblum, "Differential privacy under continual observation", STOC
    2010; Chan, Shi & Song, "Private and continual release of statistics", ACM TISSEC 2011
    (the binary mechanism).
    """

    def __init__(
        self,
        horizon: int,
        dimension: int,
        sigma: float,
        rng: np.random.Generator,
        noise: NoiseSource | None = None,
    ):
        self.horizon = check_positive_int(horizon, "horizon")
        self.dimension = check_positive_int(dimension, "dimension")
        self.sigma = check_epsilon(sigma, "sigma")
        self.rng = rng
        self.noise = noise if noise is not None else SeededNoise(rng)
        self.count = 0
        self.levels = tree_levels(self.horizon)
        # Exact running sums of the open (incomplete) node of every level, and released nodes.
        self._open = np.zeros((self.levels, self.dimension))
        self._released: dict[tuple[int, int], NDArray[np.float64]] = {}
        #: For every increment (1-based), how many released nodes contain it.
        self.nodes_per_increment: list[int] = []

    def add(self, value: ArrayLike) -> None:
        """Append increment ``t = count + 1`` and release every node that it completes.

        Parameters
        ----------
        value : array-like of shape (dimension,)
            Finite increment.

        Raises
        ------
        ValueError
            If ``value`` is not a finite vector of length ``dimension``, or ``horizon``
            increments were already added.
        """
        v = check_vector(value, "value", size=self.dimension)
        if self.count >= self.horizon:
            raise ValueError(f"the tree holds at most horizon = {self.horizon} increments")
        self.count += 1
        t = self.count
        self.nodes_per_increment.append(0)
        self._open += v
        for level in range(self.levels):
            width = 1 << level
            if t % width:
                break
            noise = self.noise.gaussian(self.sigma, self.dimension)
            self._released[(level, t // width - 1)] = self._open[level] + noise
            self._open[level] = 0.0
            for i in range(t - width, t):
                self.nodes_per_increment[i] += 1

    def prefix_sum(self, t: int | None = None) -> NDArray[np.float64]:
        """The released noisy sum of increments ``1 .. t`` (default: all added so far).

        Parameters
        ----------
        t : int, optional
            ``0 <= t <= count``; ``t = 0`` gives the zero vector (nothing released).

        Returns
        -------
        ndarray of shape (dimension,), float64
            Sum of the ``popcount(t)`` released nodes covering ``[1, t]``.

        Raises
        ------
        ValueError
            If ``t`` is outside ``[0, count]``.
        """
        t = self.count if t is None else int(t)
        if not 0 <= t <= self.count:
            raise ValueError(f"t must lie in [0, {self.count}], got {t}")
        out = np.zeros(self.dimension)
        start = 0
        for level in reversed(range(self.levels)):
            width = 1 << level
            if t - start >= width:
                out += self._released[(level, start // width)]
                start += width
        return out

    def prefix_variance(self, t: int) -> float:
        """Per-coordinate noise variance of :meth:`prefix_sum` at ``t``: popcount(t) sigma**2."""
        if t < 0:
            raise ValueError(f"t must be >= 0, got {t}")
        return bin(int(t)).count("1") * self.sigma**2

    @staticmethod
    def increment_sensitivity(norm_bound: float) -> float:
        """L2 sensitivity of one increment under "replace one": ``2 * norm_bound``."""
        if not (math.isfinite(norm_bound) and norm_bound > 0):
            raise ValueError(f"norm_bound must be finite and > 0, got {norm_bound}")
        return 2.0 * norm_bound
