r"""The sparse masking graph of SecAgg+ (Bell et al., CCS 2020): who shares and masks with whom.

In the complete graph of Bonawitz et al. every site secret-shares with, and masks with, every
other: ``O(S^2)`` key agreements, ciphertexts and mask expansions per round. SecAgg+ replaces it by
a random graph of logarithmic degree: a site shares its two secrets among its neighbours only and
masks only with them. This module fixes that graph and derives its parameters.

The graph
---------
The union of two random graphs on the round's invited sites, both public functions of one seed:

* the *k-out graph* ``K``: every site ``v`` chooses ``k`` other sites uniformly at random (the
  set ``O_v``, :func:`choose_neighbours`), and ``u, v`` are neighbours when ``u`` chose ``v`` or
  ``v`` chose ``u``;
* the *ring* ``R`` of even degree ``r`` (``r = 0``: none): the sites in a uniformly random cyclic
  order (:func:`ring_order`), each adjacent to the ``r / 2`` nearest on either side (a Harary
  graph with randomly relabelled vertices). Every site's ring neighbours are a uniformly random
  ``r``-subset of the others.

``u, v`` are neighbours when they are in ``K`` or in ``R``. A site has at least ``max(k, r)``
neighbours and :func:`expected_degree` on average; ``N[v]`` is ``v`` with its neighbours (the
*closed neighbourhood*, ``K_v = |N[v]|``): the holders of ``v``'s Shamir shares. Why two graphs:
what costs is the degree (every neighbour is an ECDSA check, two X25519 agreements and two mask
expansions), and what the degree buys is below. The security argument needs (A) enough honest
sites in every honest neighbourhood and (B) no small honest cluster cut off from the other honest
sites. For (A), a neighbourhood that is a uniform subset of a fixed size is the most honest for
its size (a hypergeometric tail); the k-out graph spends half its degree on the sites that chose
``v``, a binomial count with a far fatter lower tail. For (B), the choices of ``K`` are
independent from site to site, which the argument below needs and a ring lacks (an arc of the
ring flanked by colluders is a cluster). So ``R`` gives most of (A) and ``K`` all of (B): at
``S = 100``, ``S_C = 33``, ``Delta = 2``, ``k = 8`` with a ring of 22 has mean degree 33.9 where
the k-out graph alone needs ``k = 22`` and degree 39.1, 13 % fewer pairs at the same ``2^-40``.

The choices are a public function of a 32-byte seed, and the seed is drawn by the sites, not by
the curator (:func:`graph_seed`): every site commits to a fresh 32-byte nonce inside its signed
key advertisement (:func:`nonce_commitment`), reveals it only after the curator has shown it every
other site's commitment, and the seed is SHA-256 of all the revealed nonces, each checked against
its commitment. Each site's view of the seed thus contains its own nonce, which nobody knew when
every other contribution to that view was fixed: whatever the curator and the colluders do
(choose the round id, withhold or substitute commitments, show different sites different sets),
every honest site's graph is uniform and independent of who colludes. The only choice left to
them is to abort and start a new round. A lost nonce aborts the round: a seed over a subset
chosen after the reveals could be ground. An honest curator shows every site the same
commitments, so all sites compute the same graph. (Hashing the signed key advertisements instead
would let a colluder grind its own key after seeing the others'.)

Thresholds are per neighbourhood
--------------------------------
Site ``v`` splits its self-mask seed and its mask key ``t_v``-of-``K_v`` with
``t_v = K_v - Delta``, where ``Delta`` is the round's *dropout allowance*: the round completes
when at most ``Delta`` sites of every neighbourhood are lost (at whatever stage), in particular
whenever at most ``Delta`` sites are lost in all. Each site checks ``t_v``-sized quorums of its
own neighbourhood where the complete graph checks ``t`` of all sites:

* it shares only if ``t_v`` holders advertised, masks only if ``t_v`` of ``N[v]`` shared;
* it attests the survivor list ``U3`` (the ConsistencyCheck) only if ``t_v`` of ``N[v]`` survive
  and every surviving neighbour is one it masked with, and to each neighbour with a pairwise tag
  (HMAC-SHA256 under a key from the two sites' X25519 agreement, which the curator does not
  have);
* it reveals anything only after ``t_v`` distinct members of ``N[v]`` (itself included) attested
  the very ``U3`` it attested, and reveals a survivor's self-mask share only given that
  survivor's acknowledgement, sent with its masked input, that it masked with this site.

Why this holds against a curator that lies (``S_C`` colluders, ``h_v`` honest neighbours of an
honest ``v``; ``K_v = 1 + h_v + c_v``):

1. *No secret of one site twice.* An honest holder reveals one kind of share of ``v`` (self-mask
   seed if ``v`` is in its ``U3``, mask key if not), once. To get ``t_v`` of both, the curator
   needs two disjoint groups of honest holders of sizes ``t_v - c_v`` each, so
   ``2 (t_v - c_v) <= 1 + h_v``; with ``t_v = K_v - Delta`` that is ``1 + h_v <= 2 Delta``.
   **Condition A**: every honest site has ``1 + h_v > 2 Delta``, i.e. ``2 t_v > K_v + c_v``:
   the complete graph's ``2 t > n + S_C`` per neighbourhood (it also gives ``c_v < t_v``). It is
   also necessary: with ``h_v = 2 Delta - 1`` the split (``Delta`` honest neighbours shown a
   ``U3`` without ``v``, the others and ``v`` itself one with it, each quorum met) gives the
   curator both secrets of ``v``, hence its input; the consistency check does not stop it, since
   each holder counts attestations in its own neighbourhood.
2. *A site that reveals is never treated as lost.* If honest ``u`` reveals, ``t_u`` members of
   ``N[u]`` attested a ``U3`` holding ``u``, ``t_u - c_u`` of them honest, and those never reveal
   ``u``'s key; at most ``Delta + c_u < t_u`` holders (Condition A) remain to reveal it.
3. *Only sums over cohesive sets.* The curator can remove ``v``'s masks with a neighbour only by
   having that neighbour's key (it is "lost") or the neighbour's input in the same sum. A
   survivor's self-mask share is revealed only by neighbours it masked with (the acknowledgement),
   who are themselves never "lost" (2.); so a learned sum over a set ``T`` of honest sites holds,
   for each ``v`` in ``T``, at least ``t_v - c_v`` of ``v``'s honest closed neighbourhood: at most
   ``Delta`` honest neighbours of ``v`` lie outside ``T``. **Condition B**: no set of at most
   half of the honest sites is that cohesive. Then every learned sum covers more than half of the
   honest sites, so there is one: exactly the complete graph's guarantee (its sum covers at least
   ``t - S_C > (n - S_C) / 2`` honest sites).

The derivation
--------------
Colluders are fixed before the seed (static corruption, the model of Bonawitz et al. and Bell et
al.); probabilities are over the seed. ``n = S - 1`` other sites, ``S_H = S - S_C`` honest ones,
``q = k / n`` (the probability that a given site chose ``v``):

* **Condition A**, exactly at one honest ``v`` (:func:`secrecy_failure_bound`): ``h_v = r_h + o_h
  + b`` with ``r_h`` the honest ring neighbours, hypergeometric ``(n, S_H - 1, r)``; ``o_h`` the
  honest sites of ``O_v`` outside the ring, hypergeometric ``(n, S_H - 1 - r_h, k)`` given
  ``r_h`` (``O_v`` is a uniform ``k``-subset independent of the ring); and ``b`` the remaining
  honest sites that chose ``v``, binomial ``(S_H - 1 - r_h - o_h, q)`` given both (each chose
  independently). ``A`` fails at ``v`` when ``h_v <= 2 Delta - 1``; the bound is ``S_H`` times
  that probability (a union over the honest sites). For the k-out graph alone the union bound is
  tight: the failure at ``u`` ignoring ``v`` and the one at ``v`` ignoring ``u`` are decreasing
  events of disjoint sets of negatively associated choices, so ``P[A fails somewhere] >= S_H p -
  C(S_H, 2) p'^2`` (``p'``: one honest site fewer), within ``2^-30`` of ``S_H p`` here. At
  ``S = 100``, ``S_C = 33``, ``Delta = 2`` the k-out graph with ``k = 21`` thus fails with
  probability at least ``2^-39.93``: no sharper analysis of that graph lowers its ``k`` below 22,
  which is why the degree is cut by changing the graph instead. (With a ring, failures at nearby
  sites are positively correlated, and the union bound may be loose: a refinement not taken.)
* **Condition B**, for a set ``T`` of ``s`` honest sites and ``X`` the other ``S_H - s``: every
  ``v`` in ``T`` has ``f_v = |N(v) ∩ X| <= Delta``. For ``s <= Delta`` this implies Condition A
  failing at ``v`` (``h_v <= Delta + s - 1 <= 2 Delta - 1``), already counted; so only ``s >=
  Delta + 1`` is bounded (:func:`cohesion_failure_bound`). Given the ring, write ``f_v = r_v +
  f'_v``, ``r_v = |R(v) ∩ X|`` and ``f'_v = |{u in X \ R(v) : u in O_v or v in O_u}|``. The
  ``f'_v`` are nondecreasing functions of disjoint sets of choice indicators of ``K``, which are
  negatively associated (the indicators of one site's uniform ``k``-subset are, Joag-Dev &
  Proschan 1983, and so are independent unions of them) and independent of the ring, so
  ``P[all f_v <= Delta | R] <= prod_v g(r_v)`` with ``g(r) = 1[r <= Delta] P[f' <= Delta - r]``,
  ``f'`` over ``|X| - r`` candidates: ``sum_a Hyp(a; n, |X| - r, k) Bin(<= Delta - r - a; |X| -
  r - a, q)``. The ``r_v`` are dependent through the ring; Hölder's inequality bounds the
  expectation of the product of ``s`` of them whatever their dependence, ``E[prod_v g(r_v)] <=
  E[g(r)^s]``, each ``r_v`` hypergeometric ``(n, |X|, r)``. Summed over the ``C(S_H, s)`` sets:
  ``sum_{s=Delta+1}^{floor(S_H / 2)} C(S_H, s) sum_{r=0}^{Delta} Hyp(r; n, S_H - s, ring)
  g(r)^s``. With no ring it is the product bound over independent sites of the k-out graph.

:func:`failure_bound` is their sum; a sparse round is valid only when it is at most ``2^-40``
(``SECURITY_BITS``; :class:`dpmarket.common.secagg.protocol.RoundParams` refuses others).
:func:`plan_graph` takes, among the ``(k, r)`` that reach it, the least mean degree
(:func:`best_graph`); :func:`min_neighbours` is the least ``k`` for a given ring. Numbers
(tested): at ``S = 100`` and ``Delta = 2``, ``S_C = 5``: ``k = 5``, ring 8 (mean degree 17.0; the
k-out graph alone: ``k = 9``, 17.2); ``S_C = 33`` (CAPE's default ``ceil(S/3) - 1``): ``k = 8``,
ring 22 (33.9; alone ``k = 22``, 39.1). ``Delta = 5``, ``S_C = 33``: ``k = 13``, ring 30 (46.9;
alone 30, 50.9). The floor for this ``S_C`` and ``Delta`` under the same union over sites: in a
graph whose every neighbourhood is a uniform subset of ``d`` sites, ``S_H P[Hyp(n, S_H - 1, d) <=
2 Delta - 1]`` is ``2^-39.3`` at ``d = 29`` and ``2^-42.4`` at 30, so such a graph needs degree
30 (and a proof of Condition B, which the ring alone does not have); the ring's 33.9 is within
13 % of it. ``k`` grows like ``log S`` at a fixed fraction of colluders and a fixed
allowance (Bell et al.'s ``O(log n)`` degree), while the complete graph's degree grows like ``S``.

A wrong graph (bound exceeded) gives the curator no more than a chance of ``2^-40`` per round:
rounds are cheap to restart, so an owner that runs ``R`` rounds accepts ``R 2^-40``.

References
----------
J. Bell, K. Bonawitz, A. Gascón, T. Lepoint, M. Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020 (ePrint 2020/704): the sparse graph, per-neighbourhood
thresholds, the malicious-server variant. K. Bonawitz et al., CCS 2017, Figure 4 and Section 6.
K. Joag-Dev, F. Proschan, "Negative association of random variables", Ann. Stat. 11(1), 1983.
F. Harary, "The maximum connectivity of a graph", PNAS 48(7), 1962 (the ring).
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import bdtr, gammaln, logsumexp

from dpmarket.common.secagg.crypto import KEY_BYTES, SecAggError, encode_fields, prg_words

__all__ = [
    "MAX_DEGREE_FRACTION",
    "SECURITY_BITS",
    "SPARSE_MIN_SITES",
    "GraphPlan",
    "NeighbourGraph",
    "best_graph",
    "choose_neighbours",
    "cohesion_failure_bound",
    "expected_degree",
    "failure_bound",
    "graph_seed",
    "min_neighbours",
    "nonce_commitment",
    "plan_graph",
    "ring_order",
    "secrecy_failure_bound",
]

#: A sparse round is valid only if the probability over its graph that the curator learns more
#: than the complete graph would let it is at most 2^-SECURITY_BITS.
SECURITY_BITS = 40
#: The fewest sites for which :func:`plan_graph` chooses the sparse graph (bench/README.md,
#: "SecAgg+": below it a complete round at D = 100,000 costs at most ~0.45 s of CPU, and it
#: tolerates (S - S_C) / 2 lost sites, where a sparse one tolerates the allowance per
#: neighbourhood).
SPARSE_MIN_SITES = 40
#: :func:`plan_graph` chooses the sparse graph only when its mean degree is at most this share of
#: the complete graph's ``S - 1``: measured, a round's work is proportional to the degree (CPU
#: ratio sparse / complete 0.52-0.72 for degree ratios 0.54-0.78 at S = 20-100), so the sparse
#: graph then saves at least a third of it.
MAX_DEGREE_FRACTION = 2 / 3
#: Site ids are read as indices into the sorted site list; the keys that pick the neighbours keep
#: the index in their low 16 bits (so at most 2^16 sites).
MAX_SITES = 1 << 16

_COMMIT_LABEL = b"dpmarket/secagg/v1/graph-nonce"
_SEED_LABEL = b"dpmarket/secagg/v1/graph-seed"
_CHOICE_LABEL = b"dpmarket/secagg/v1/graph-choices"
_RING_LABEL = b"dpmarket/secagg/v1/graph-ring"


def nonce_commitment(round_id: bytes, site: str, nonce: bytes) -> bytes:
    """SHA-256 commitment of a site's graph nonce, bound to the round and the site.

    ``SHA-256(encode_fields(label, round_id, site (UTF-8), nonce))``: hiding (the nonce is 32
    random bytes) and binding (collision resistance), so a site's contribution to the seed is
    fixed, and unknown to everyone else, before anyone reveals.

    Raises
    ------
    ValueError
        If ``nonce`` is not 32 bytes.
    """
    if len(nonce) != KEY_BYTES:
        raise ValueError(f"a graph nonce is {KEY_BYTES} bytes, got {len(nonce)}")
    return hashlib.sha256(encode_fields(_COMMIT_LABEL, round_id, site.encode(), nonce)).digest()


def graph_seed(
    params_digest: bytes,
    nonces: Mapping[str, bytes],
    commitments: Mapping[str, bytes],
    round_id: bytes,
) -> bytes:
    """The 32-byte seed of a round's graph from every advertised site's revealed nonce.

    ``SHA-256(encode_fields(label, params_digest, *(site, nonce) for sites in sorted order))``,
    after checking that exactly the committed sites revealed and every nonce opens its
    commitment.

    Parameters
    ----------
    params_digest : bytes
        :attr:`dpmarket.common.secagg.protocol.RoundParams.digest`.
    nonces : mapping of str to bytes
        Site -> its revealed 32-byte nonce.
    commitments : mapping of str to bytes
        Site -> the commitment of its signed key advertisement (``U1``).
    round_id : bytes

    Returns
    -------
    bytes
        32 bytes.

    Raises
    ------
    SecAggError
        If a committed site did not reveal, a site revealed without a commitment, or a nonce
        does not open its commitment.
    """
    missing = sorted(set(commitments) - set(nonces))
    if missing:
        raise SecAggError(f"sites of U1 revealed no graph nonce: {missing}")
    strangers = sorted(set(nonces) - set(commitments))
    if strangers:
        raise SecAggError(f"graph nonces from sites without a commitment: {strangers}")
    fields = [_SEED_LABEL, params_digest]
    # nonce_commitment, with the fields every commitment of the round shares encoded once.
    prefix = encode_fields(_COMMIT_LABEL, round_id)
    for site in sorted(nonces):
        nonce, name = nonces[site], site.encode()
        if (
            len(nonce) != KEY_BYTES
            or hashlib.sha256(prefix + encode_fields(name, nonce)).digest() != commitments[site]
        ):
            raise SecAggError(f"the graph nonce of {site!r} does not open its commitment")
        fields += [name, nonce]
    return hashlib.sha256(encode_fields(*fields)).digest()


def choose_neighbours(seed: bytes, sites: int, k: int) -> np.ndarray:
    """Every site's ``k`` random choices, a public function of the seed.

    Site ``i`` (its index in the sorted site list) chooses the ``k`` sites ``j != i`` with the
    smallest keys ``w[i, j]``, where ``w`` is the ``sites x sites`` array of 64-bit words of
    :func:`~dpmarket.common.secagg.crypto.prg_words` (AES-256 counter mode) under ``SHA-256(label,
    seed)``, row major, with the low 16 bits of each word replaced by ``j``: the keys of a row are
    distinct, and the ``k`` smallest of independent uniform keys are a uniform ``k``-subset (ties of
    the top 48 bits, which the index breaks, have probability below ``sites^2 / 2^49``).

    Parameters
    ----------
    seed : bytes
        32 bytes (:func:`graph_seed`).
    sites : int
        ``S``, ``2 <= S <= 2^16``.
    k : int
        ``1 <= k <= S - 1``.

    Returns
    -------
    ndarray of shape (sites, k), int64
        Row ``i`` holds the indices ``i`` chose, in increasing order.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_choice_args(seed, sites, k)
    return np.nonzero(_choice_matrix(seed, sites, k))[1].reshape(sites, k).astype(np.int64)


def _check_choice_args(seed: bytes, sites: int, k: int) -> None:
    if len(seed) != KEY_BYTES:
        raise ValueError(f"the graph seed is {KEY_BYTES} bytes, got {len(seed)}")
    if not 2 <= sites <= MAX_SITES:
        raise ValueError(f"sites must lie in [2, {MAX_SITES}], got {sites}")
    if not 1 <= k <= sites - 1:
        raise ValueError(f"k must lie in [1, {sites - 1}] with {sites} sites, got {k}")


def _choice_matrix(seed: bytes, sites: int, k: int) -> np.ndarray:
    """``chosen[i, j]``: site ``i`` chose ``j`` (:func:`choose_neighbours`; arguments checked
    there or by :meth:`NeighbourGraph.build`). The keys of a row are distinct, so exactly the
    ``k`` at most the row's ``k``-th smallest are chosen."""
    key = hashlib.sha256(encode_fields(_CHOICE_LABEL, seed)).digest()
    words = prg_words(key, sites * sites).reshape(sites, sites)
    index = np.arange(sites)
    keys = (words & ~np.uint64(0xFFFF)) | index.astype(np.uint64)[None, :]
    keys[index, index] = np.iinfo(np.uint64).max
    kth = np.partition(keys, k - 1, axis=1)[:, k - 1 : k]
    chosen: np.ndarray = keys <= kth
    return chosen


def ring_order(seed: bytes, sites: int) -> np.ndarray:
    """The ring's cyclic order of the sites, a public function of the seed.

    The site indices sorted by the keys ``w[j]``: the ``sites`` 64-bit words of
    :func:`~dpmarket.common.secagg.crypto.prg_words` under ``SHA-256(label, seed)`` (a label of
    its own, so the order is independent of :func:`choose_neighbours`), with the low 16 bits of
    each word replaced by ``j``, as there: the keys are distinct, and sorting independent uniform
    keys gives a uniform order (ties of the top 48 bits, which the index breaks, have
    probability below ``sites^2 / 2^49``).

    Parameters
    ----------
    seed : bytes
        32 bytes (:func:`graph_seed`).
    sites : int
        ``S``, ``2 <= S <= 2^16``.

    Returns
    -------
    ndarray of shape (sites,), int64
        A permutation of ``0 .. S - 1``: the site at each position of the ring.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    if len(seed) != KEY_BYTES:
        raise ValueError(f"the graph seed is {KEY_BYTES} bytes, got {len(seed)}")
    if not 2 <= sites <= MAX_SITES:
        raise ValueError(f"sites must lie in [2, {MAX_SITES}], got {sites}")
    key = hashlib.sha256(encode_fields(_RING_LABEL, seed)).digest()
    words = prg_words(key, sites)
    keys = (words & ~np.uint64(0xFFFF)) | np.arange(sites, dtype=np.uint64)
    return np.argsort(keys).astype(np.int64)


class NeighbourGraph:
    """A round's graph (its k-out graph and ring): each site's neighbours and threshold.

    Parameters
    ----------
    sites : sequence of str
        The round's invited sites (:attr:`RoundParams.sites`); kept sorted.
    adjacency : ndarray of shape (S, S), bool
        Symmetric, ``False`` on the diagonal: ``adjacency[i, j]`` when site ``i`` chose ``j`` or
        ``j`` chose ``i`` (indices into the sorted sites).
    allowance : int
        ``Delta``: lost sites tolerated per neighbourhood.

    Use :meth:`build`. Neighbour sets are computed on first use and kept.
    """

    def __init__(self, sites: Sequence[str], adjacency: np.ndarray, allowance: int) -> None:
        self.sites = tuple(sorted(sites))
        self.adjacency = adjacency
        self.allowance = allowance
        self._position = {site: i for i, site in enumerate(self.sites)}
        self._neighbours: dict[str, frozenset[str]] = {}

    @classmethod
    def build(
        cls, sites: Sequence[str], seed: bytes, k: int, allowance: int, ring: int = 0
    ) -> NeighbourGraph:
        """The graph of ``sites`` from ``seed``: the k-out graph of :func:`choose_neighbours`
        and, if ``ring > 0``, every site joined to the ``ring / 2`` nearest on either side of
        :func:`ring_order`.

        Raises
        ------
        ValueError
            As :func:`choose_neighbours`, or if ``ring`` is odd, negative or above ``S - 2``.
        """
        n = len(sites)
        _check_ring(n, ring)
        _check_choice_args(seed, n, k)
        adjacency = _choice_matrix(seed, n, k)
        if ring:
            order = ring_order(seed, n)
            ahead = order[(np.arange(n)[:, None] + np.arange(1, ring // 2 + 1)[None, :]) % n]
            adjacency[np.repeat(order, ring // 2), ahead.ravel()] = True
        adjacency |= adjacency.T
        return cls(sites, adjacency, allowance)

    def neighbours(self, site: str) -> frozenset[str]:
        """The sites ``site`` chose or that chose it (never itself)."""
        found = self._neighbours.get(site)
        if found is None:
            row = np.flatnonzero(self.adjacency[self._position[site]])
            found = frozenset(self.sites[j] for j in row.tolist())
            self._neighbours[site] = found
        return found

    def closed(self, site: str) -> frozenset[str]:
        """``N[site]``: the site and its neighbours, the holders of its shares."""
        return self.neighbours(site) | {site}

    def threshold(self, site: str) -> int:
        """``t_v = K_v - Delta``: shares needed to rebuild ``site``'s secrets, and the quorum of
        its neighbourhood it needs before it reveals anything."""
        return int(self.adjacency[self._position[site]].sum()) + 1 - self.allowance

    def index(self, site: str) -> int:
        """The site's Shamir x coordinate minus one: its position in the sorted site list."""
        return self._position[site]


def expected_degree(sites: int, k: int, ring: int = 0) -> float:
    """Mean number of neighbours of a site: ``n (1 - (1 - r / n) (1 - k / n)^2)``, ``n = S - 1``.

    Another site is a neighbour unless it is off the ring (probability ``1 - r / n``), was not
    chosen (``1 - k / n``) and did not choose (``1 - k / n``), three independent events. With no
    ring, ``k + (n - k) k / n``.
    """
    n = sites - 1
    return n * (1.0 - (1.0 - ring / n) * (1.0 - k / n) ** 2)


def _check_args(sites: int, colluders: int, k: int, allowance: int) -> None:
    if not 2 <= sites <= MAX_SITES:
        raise ValueError(f"sites must lie in [2, {MAX_SITES}], got {sites}")
    if not 0 <= colluders <= sites - 1:
        raise ValueError(f"colluders must lie in [0, {sites - 1}], got {colluders}")
    if not 1 <= k <= sites - 1:
        raise ValueError(f"k must lie in [1, {sites - 1}], got {k}")
    if allowance < 0:
        raise ValueError(f"the dropout allowance must be >= 0, got {allowance}")


def _check_ring(sites: int, ring: int) -> None:
    if ring < 0 or ring % 2 or ring > sites - 2:
        raise ValueError(
            f"the ring's degree must be even and in [0, {sites - 2}] with {sites} sites, got {ring}"
        )


def _log_choose(n: Any, s: Any) -> Any:
    """``log C(n, s)`` (arrays broadcast)."""
    return gammaln(n + 1) - gammaln(s + 1) - gammaln(n - s + 1)


def _hyp(successes: Any, total: int, marked: Any, draws: int) -> Any:
    """``P[Hyp = successes]`` for ``draws`` draws without replacement from ``total`` of which
    ``marked`` are marked (arrays broadcast), 0 outside the support; a point mass at 0 when
    ``draws = 0``. From log-gamma functions: ``scipy.stats.hypergeom.pmf`` gives the same values
    (tested) at a hundredth of the speed on the arrays of :func:`cohesion_failure_bound`."""
    x = np.asarray(successes, dtype=np.float64)
    m = np.asarray(marked, dtype=np.float64)
    valid = (x >= 0) & (x <= m) & (draws - x >= 0) & (draws - x <= total - m)
    x, m = np.where(valid, x, 0.0), np.where(valid, m, 0.0)
    with np.errstate(invalid="ignore"):
        log_p = (
            _log_choose(m, x)
            + _log_choose(total - m, draws - x)
            - _log_choose(np.float64(total), np.float64(draws))
        )
    return np.where(valid, np.exp(log_p), 0.0)


def _binom_cdf(upto: Any, trials: Any, p: float) -> Any:
    """``P[Bin(trials, p) <= upto]`` (arrays broadcast): 0 for ``upto < 0``, 1 for ``upto >=
    trials``."""
    upto, trials = np.broadcast_arrays(np.asarray(upto, np.int64), np.asarray(trials, np.int64))
    inside = (upto >= 0) & (upto < trials)
    values = bdtr(np.where(inside, upto, 0), np.where(inside, trials, 1), p)
    return np.where(upto >= trials, 1.0, np.where(inside, values, 0.0))


@functools.lru_cache(maxsize=1024)
def secrecy_failure_bound(
    sites: int, colluders: int, k: int, allowance: int, ring: int = 0
) -> float:
    """Upper bound on the probability that Condition A fails at some honest site.

    ``S_H P[h_v <= 2 Delta - 1]`` with ``h_v = r_h + o_h + b`` the honest neighbours of an honest
    site (module docstring): ``r_h ~ Hyp(n, S_H - 1, ring)``, ``o_h ~ Hyp(n, S_H - 1 - r_h, k)``,
    ``b ~ Bin(S_H - 1 - r_h - o_h, k / n)``, summed exactly.

    Parameters
    ----------
    sites, colluders, k, allowance : int
        ``S``, ``S_C``, ``k``, ``Delta``.
    ring : int, default 0
        The ring's (even) degree.

    Returns
    -------
    float
        In ``[0, S_H]`` (a union bound; compare with ``2^-40``).

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_args(sites, colluders, k, allowance)
    _check_ring(sites, ring)
    honest, others = sites - colluders, sites - 1
    limit = 2 * allowance - 1
    if limit < 0:
        return 0.0
    q = k / others
    r_h = np.arange(0, min(limit, ring) + 1)[:, None]  # honest ring neighbours
    o_h = np.arange(0, limit + 1)[None, :]  # honest sites v chose, off the ring
    p_ring = _hyp(r_h, others, honest - 1, ring)
    p_out = _hyp(o_h, others, np.maximum(honest - 1 - r_h, 0), k)
    rest = np.maximum(honest - 1 - r_h - o_h, 0)
    p_in = _binom_cdf(limit - r_h - o_h, rest, q)
    terms = np.where(r_h + o_h <= limit, p_ring * p_out * p_in, 0.0)
    return float(honest * np.sum(terms))


@functools.lru_cache(maxsize=1024)
def cohesion_failure_bound(
    sites: int, colluders: int, k: int, allowance: int, ring: int = 0
) -> float:
    """Upper bound on the probability that some set of ``Delta + 1`` to half the honest sites
    keeps all but ``Delta`` of every member's honest neighbours (Condition B; smaller sets only
    occur where Condition A fails, counted by :func:`secrecy_failure_bound`).

    ``sum_{s=Delta+1}^{floor(S_H / 2)} C(S_H, s) sum_{r=0}^{Delta} Hyp(r; n, S_H - s, ring)
    g_s(r)^s``, ``g_s(r) = sum_a Hyp(a; n, S_H - s - r, k) Bin(<= Delta - r - a; S_H - s - r - a,
    k / n)`` (module docstring: negative association of the k-out choices given the ring, then
    Hölder's inequality over the ring).

    Parameters
    ----------
    sites, colluders, k, allowance : int
        ``S``, ``S_C``, ``k``, ``Delta``.
    ring : int, default 0
        The ring's (even) degree.

    Returns
    -------
    float
        The bound (may exceed 1 when it says nothing).

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_args(sites, colluders, k, allowance)
    _check_ring(sites, ring)
    honest, others = sites - colluders, sites - 1
    s = np.arange(allowance + 1, honest // 2 + 1)
    if s.size == 0:
        return 0.0
    q = k / others
    outside = (honest - s)[:, None, None]  # |X|
    r = np.arange(0, min(allowance, ring) + 1)[None, :, None]  # X's sites among v's ring ones
    a = np.arange(0, allowance + 1)[None, None, :]  # X's sites among those v chose, off the ring
    candidates = np.maximum(outside - r, 0)
    p_out = _hyp(a, others, candidates, k)
    p_in = _binom_cdf(allowance - r - a, np.maximum(candidates - a, 0), q)
    g = np.sum(np.where((a <= candidates) & (r + a <= allowance), p_out * p_in, 0.0), axis=2)
    p_ring = _hyp(r[:, :, 0], others, outside[:, :, 0], ring)
    with np.errstate(divide="ignore"):
        inner = np.log(p_ring) + s[:, None] * np.log(np.minimum(g, 1.0))
        logs = _log_choose(honest, s) + logsumexp(inner, axis=1)
    finite = logs[np.isfinite(logs)]
    return float(np.exp(logsumexp(finite))) if finite.size else 0.0


def failure_bound(sites: int, colluders: int, k: int, allowance: int, ring: int = 0) -> float:
    """``secrecy_failure_bound + cohesion_failure_bound``: the probability, over the graph, that
    the curator and ``colluders`` colluding sites can learn more than one sum over more than half
    of the honest sites (module docstring). Valid rounds have it at most ``2^-SECURITY_BITS``.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    return secrecy_failure_bound(sites, colluders, k, allowance, ring) + cohesion_failure_bound(
        sites, colluders, k, allowance, ring
    )


@functools.lru_cache(maxsize=256)
def min_neighbours(
    sites: int, colluders: int, allowance: int, bits: int = SECURITY_BITS, ring: int = 0
) -> int | None:
    """The least ``k`` whose graph (with a ring of degree ``ring``) meets ``failure_bound <=
    2^-bits``, or ``None`` below ``S - 1``.

    Parameters
    ----------
    sites : int
        ``S >= 3``.
    colluders : int
        ``S_C`` in ``[0, S - 1]``.
    allowance : int
        ``Delta >= 0``: the lost sites every neighbourhood must tolerate.
    bits : int, default 40
    ring : int, default 0
        The ring's (even) degree; 0 for the k-out graph alone.

    Returns
    -------
    int or None
        ``k`` in ``[1, S - 2]`` with ``max(k, ring) >= Delta + 1`` (so every ``t_v >= 2``), or
        ``None`` when none reaches the bound.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_args(sites, colluders, 1, allowance)
    _check_ring(sites, ring)
    target = 2.0**-bits
    for k in range(max(1, allowance + 1 - ring), sites - 1):
        if failure_bound(sites, colluders, k, allowance, ring) <= target:
            return k
    return None


@dataclass(frozen=True)
class GraphPlan:
    """A sparse round's graph parameters (:func:`best_graph`, :func:`plan_graph`).

    Attributes
    ----------
    neighbours : int
        ``k``: choices per site.
    allowance : int
        ``Delta``: lost sites tolerated per neighbourhood.
    failure : float
        :func:`failure_bound` of the plan, at most ``2^-40``.
    ring : int
        The ring's (even) degree, 0 for none.
    mean_degree : float
        :func:`expected_degree` of the plan.
    """

    neighbours: int
    allowance: int
    failure: float
    ring: int = 0
    mean_degree: float = 0.0


@functools.lru_cache(maxsize=256)
def best_graph(
    sites: int, colluders: int, allowance: int, *, bits: int = SECURITY_BITS
) -> GraphPlan | None:
    """The graph of least mean degree meeting ``failure_bound <= 2^-bits``, or ``None``.

    Starts from the k-out graph alone (:func:`min_neighbours`, ring 0) and walks ``k`` down one at
    a time, raising the ring (by 2) until the bound is met again: a smaller ``k`` needs at least
    the ring of a larger one, so the walk visits each ``k`` and each ring once. It stops when the
    ring alone reaches the best mean degree found (a site's degree is at least its ring's), and
    returns the ``(k, ring)`` of least :func:`expected_degree` (ties: the larger ``k``). Every
    candidate is checked against the bound, so what it returns meets it whatever the shape of the
    bound.

    Parameters
    ----------
    sites : int
        ``S >= 3``.
    colluders : int
        ``S_C``.
    allowance : int
        ``Delta``.
    bits : int, default 40

    Returns
    -------
    GraphPlan or None
        ``None`` when no graph meets the bound.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_args(sites, colluders, 1, allowance)
    target = 2.0**-bits
    top_ring = sites - 2 if sites % 2 == 0 else sites - 3

    def meets(k: int, ring: int) -> bool:
        valid = max(k, ring) >= allowance + 1  # every t_v >= 2
        return valid and failure_bound(sites, colluders, k, allowance, ring) <= target

    alone = min_neighbours(sites, colluders, allowance, bits)
    start = alone if alone is not None else sites - 2
    best: tuple[float, int, int] | None = None
    if alone is not None:
        best = (expected_degree(sites, alone, 0), alone, 0)
    ring = 0
    for k in range(start - 1 if alone is not None else start, 0, -1):
        while ring <= top_ring and not meets(k, ring):
            ring += 2
        if ring > top_ring or (best is not None and ring >= best[0]):
            break
        candidate = (expected_degree(sites, k, ring), k, ring)
        if best is None or candidate[0] < best[0]:
            best = candidate
    if best is None:
        return None
    degree, k, ring = best
    failure = failure_bound(sites, colluders, k, allowance, ring)
    return GraphPlan(k, allowance, failure, ring, degree)


def plan_graph(
    sites: int, colluders: int, allowance: int, *, bits: int = SECURITY_BITS
) -> GraphPlan | None:
    """The sparse graph for a round of ``sites`` sites, or ``None`` for the complete graph.

    The sparse graph is used from :data:`SPARSE_MIN_SITES` sites, when the graph of least mean
    degree meeting the security target (:func:`best_graph`) has a mean degree of at most
    :data:`MAX_DEGREE_FRACTION` of ``S - 1`` (otherwise the complete graph, whose work is
    ``S - 1`` pairs per site, costs little more and tolerates far more lost sites).

    Parameters
    ----------
    sites : int
    colluders : int
        ``S_C``.
    allowance : int
        ``Delta``: lost sites the round must tolerate per neighbourhood.
    bits : int, default 40

    Returns
    -------
    GraphPlan or None

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    if sites < SPARSE_MIN_SITES:
        return None
    plan = best_graph(sites, colluders, allowance, bits=bits)
    if plan is None or plan.mean_degree > MAX_DEGREE_FRACTION * (sites - 1):
        return None
    return plan
