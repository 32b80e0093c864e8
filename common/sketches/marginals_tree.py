"""The closed-form tree model a marginals sketch's derived plan scores each selection against.

A marginals release (:class:`dpmarket.common.sketches.marginals.MarginalsMechanism`) selects the
2-way marginals it measures by the exponential mechanism, scoring every candidate pair by how
badly a model of what is measured so far fits it (AIM's adaptivity: McKenna et al., VLDB 2022).
AIM fits a graphical model after every measurement; :class:`ChowLiuTree` is the model of the
same measurements that needs no fit: the maximum spanning forest of the measured pairs (Chow &
Liu 1968), whose joint distribution is the product of the tree's conditionals, so that any
pair's 2-way marginal is a chain of small matrix products along the tree path between its
columns (and the product of the 1-way marginals for columns in different trees).

Why a tree: after ``(a, b)`` and ``(b, c)`` are measured, most of the dependence between ``a``
and ``c`` is what passes through ``b``; a model that knows it scores ``(a, c)`` low, and the
selection moves on to a pair whose dependence no measured path explains. That is the redundancy
one round of top-``k`` selections against independence cannot see, and what a later round's
fit buys at a jax compilation's cost; here it costs microseconds per candidate.

Pure numpy (and ``networkx`` for the spanning forest): no I/O. Everything here is computed from
released (noisy) measurements, hence post-processing: scoring against it costs no privacy
beyond the selections themselves (their sensitivity is derived in
:class:`~dpmarket.common.sketches.marginals.MarginalsMechanism`'s Notes).

References
----------
Chow & Liu, "Approximating discrete probability distributions with dependence trees", IEEE
Trans. Inf. Theory 14(3), 1968; McKenna, Miklau & Sheldon, JPC 2021 (MST: a maximum spanning tree
of 2-way marginals as the model of a release).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["ChowLiuTree"]


class ChowLiuTree:
    """Every column's 1-way shares, tied by the maximum spanning forest of the measured pairs.

    Parameters
    ----------
    shares : sequence of ndarray, one per column, shape (cells_j,)
        Each column's distribution (non-negative, summing to 1): the 1-way measurements, clipped
        at 0 and normalised.
    total : float
        The model's record count (> 0).
    pairs : mapping of (a, b) with a < b to ndarray of shape (cells_a * cells_b,)
        The measured 2-way marginals' noisy counts (C order over ``(a, b)``).

    Notes
    -----
    Each measured pair's table is clipped at 0 and normalised (a uniform table if nothing is
    left); its weight is the L1 distance between that table and the product of its own margins
    (the dependence the measurement shows, what the selection scored it by). Kruskal's maximum
    spanning forest of these weights (``networkx``) keeps at most ``d - 1`` of them. The pair
    ``(u, v)``'s marginal, for the tree path ``u = x_0, x_1, ..., x_m = v``, is ``P(x_0, x_1)
    P(x_2 | x_1) ... P(x_m | x_{m-1})`` with each conditional its edge's table divided by its row
    sums (the column's 1-way shares where a row is empty): the marginal of the tree-structured
    distribution (a Markov chain along the path). Columns in different trees are independent.
    A measured pair off the forest (a cycle's chord) is answered along the path too: it is not a
    candidate again, so its score does not matter.
    """

    def __init__(
        self,
        shares: Sequence[NDArray[np.float64]],
        total: float,
        pairs: Mapping[tuple[int, int], NDArray[np.float64]],
    ) -> None:
        import networkx as nx

        self.shares = [np.asarray(s, dtype=np.float64) for s in shares]
        self.total = float(total)
        self._joint: dict[tuple[int, int], NDArray[np.float64]] = {}
        graph = nx.Graph()
        graph.add_nodes_from(range(len(self.shares)))
        for (a, b), values in pairs.items():
            shape = (self.shares[a].size, self.shares[b].size)
            table = np.clip(np.asarray(values, dtype=np.float64).reshape(shape), 0.0, None)
            mass = float(table.sum())
            table = table / mass if mass > 0 else np.full(shape, 1.0 / table.size)
            self._joint[a, b] = table
            product = np.outer(table.sum(axis=1), table.sum(axis=0))
            graph.add_edge(a, b, weight=float(np.abs(table - product).sum()))
        self._forest = nx.maximum_spanning_tree(graph, algorithm="kruskal")

    def _oriented(self, u: int, v: int) -> NDArray[np.float64]:
        """The measured joint of the edge ``(u, v)`` with ``u``'s cells on the rows."""
        return self._joint[u, v] if u < v else self._joint[v, u].T

    def _conditional(self, u: int, v: int) -> NDArray[np.float64]:
        """``P(v | u)`` from the edge's table, rows of ``u``'s cells summing to 1."""
        table = self._oriented(u, v)
        rows = table.sum(axis=1, keepdims=True)
        safe = np.where(rows > 0, rows, 1.0)
        return np.where(rows > 0, table / safe, self.shares[v][None, :])

    def marginal(self, clique: Sequence[int]) -> NDArray[np.float64]:
        """The model's counts on a 1- or 2-column clique, shape ``cells[clique]``.

        Raises
        ------
        ValueError
            For a clique of more than two columns.
        """
        import networkx as nx

        cols = [int(c) for c in clique]
        if len(cols) == 1:
            return self.shares[cols[0]] * self.total
        if len(cols) != 2:
            raise ValueError(f"the tree model answers 1- and 2-way marginals, got {cols}")
        u, v = cols
        if not nx.has_path(self._forest, u, v):
            return np.outer(self.shares[u], self.shares[v]) * self.total
        path = nx.shortest_path(self._forest, u, v)
        out = self._oriented(path[0], path[1])
        for a, b in itertools.pairwise(path[1:]):
            out = out @ self._conditional(a, b)
        return np.asarray(out * self.total, dtype=np.float64)
