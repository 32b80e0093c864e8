"""The sparse masking graph of SecAgg+ (Bell et al., CCS 2020): who shares with and masks with whom.

In the complete graph of Bonawitz et al. every site secret-shares with, and masks with, every
other: ``O(S^2)`` key agreements, ciphertexts and mask expansions per round. SecAgg+ replaces it by
a random graph of logarithmic degree: a site shares its two secrets among its neighbours only and
masks only with them. This module fixes that graph and derives its parameters.

The graph
---------
A *k-out* random graph on the round's invited sites: every site ``v`` chooses ``k`` other sites
uniformly at random (the set ``O_v``), and ``u, v`` are neighbours when ``u`` chose ``v`` or
``v`` chose ``u``. A degree is at least ``k`` and about ``2 k - k^2 / (S - 1)`` on average.
``N[v]`` is ``v`` with its neighbours (the *closed neighbourhood*, ``K_v = |N[v]|``): the holders
of ``v``'s Shamir shares.

The choices are a public function of a 32-byte seed (:func:`choose_neighbours`), and the seed is
drawn by the sites, not by the curator (:func:`graph_seed`): every site commits to a fresh 32-byte
nonce inside its signed key advertisement (:func:`nonce_commitment`), reveals it only after the
curator has shown it every other site's commitment, and the seed is SHA-256 of all the revealed
nonces, each checked against its commitment. Each site's view of the seed thus contains its own
nonce, which nobody knew when every other contribution to that view was fixed: whatever the
curator and the colluders do (choose the round id, withhold or substitute commitments, show
different sites different sets), every honest site's graph is uniform and independent of who
colludes. The only choice left to them is to abort and start a new round. A lost nonce aborts the
round: a seed over a subset chosen after the reveals could be ground. An honest curator shows
every site the same commitments, so all sites compute the same graph. (Hashing the signed key
advertisements instead would let a colluder grind its own key after seeing the others'.)

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
   the complete graph's ``2 t > n + S_C`` per neighbourhood (it also gives ``c_v < t_v``).
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

The derivation (as Bell et al.'s: a union bound over sites and over sets of sites)
-------------------------------------------------------------------------------
Colluders are fixed before the seed (static corruption, the model of Bonawitz et al. and Bell et
al.); probabilities are over the seed. With ``q = k / (S - 1)`` (the probability that a given
site chose ``v``):

* Condition A fails at honest ``v`` when ``(k - a) + b <= 2 Delta - 1`` with ``a = |O_v ∩ C|``
  hypergeometric ``(S - 1, S_C, k)`` and ``b`` the honest sites outside ``O_v`` that chose ``v``,
  binomial ``(S_H - 1 - k + a, q)`` given ``a``: :func:`secrecy_failure_bound` sums it exactly
  and multiplies by ``S_H``. Colluders that chose ``v`` do not count: they add as many holders as
  colluding holders.
* Condition B: for honest ``T`` of size ``s <= S_H / 2`` and ``X`` the other ``S_H - s`` honest
  sites, ``f_v = |{u in X : u in O_v or v in O_u}|`` must be at most ``Delta`` for every ``v`` in
  ``T``; ``P[f_v <= Delta] = sum_a Hyp(a; S - 1, |X|, k) Bin(<= Delta - a; |X| - a, q)``. The
  ``f_v`` are nondecreasing functions of disjoint sets of choice indicators, and the indicators
  of one site's uniform ``k``-subset are negatively associated (Joag-Dev & Proschan 1983; so are
  independent unions of them), so ``P[all f_v <= Delta] <= prod_v P[f_v <= Delta]``:
  :func:`cohesion_failure_bound` sums ``C(S_H, s) P[f_v <= Delta]^s`` over ``s``.

:func:`failure_bound` is their sum; a sparse round is valid only when it is at most ``2^-40``
(``SECURITY_BITS``; :class:`dpmarket.common.secagg.protocol.RoundParams` refuses others), and
:func:`min_neighbours` is the least ``k`` that reaches it. Numbers (tested): at ``S = 100`` with
``S_C = 5`` and ``Delta = 5``, ``k = 15`` (mean degree 28 of 99); ``S_C = 10``: 19; ``S_C = 33``
(CAPE's default ``ceil(S/3) - 1``): 30 (mean degree 51); at ``S = 1,000``, ``S_C = 50``,
``Delta = 5``: 19, and ``S_C = 100``: 22 — ``k`` grows like ``log S`` at a fixed fraction of
colluders and a fixed allowance (Bell et al.'s ``O(log n)`` degree), while the complete graph's
degree grows like ``S``.

A wrong graph (bound exceeded) gives the curator no more than a chance of ``2^-40`` per round:
rounds are cheap to restart, so an owner that runs ``R`` rounds accepts ``R 2^-40``.

References
----------
J. Bell, K. Bonawitz, A. Gascón, T. Lepoint, M. Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020 (ePrint 2020/704): the sparse graph, per-neighbourhood
thresholds, the malicious-server variant. K. Bonawitz et al., CCS 2017, Figure 4 and Section 6.
K. Joag-Dev, F. Proschan, "Negative association of random variables", Ann. Stat. 11(1), 1983.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln, logsumexp
from scipy.stats import binom, hypergeom

from dpmarket.common.secagg.crypto import KEY_BYTES, SecAggError, encode_fields, prg_words

__all__ = [
    "MAX_DEGREE_FRACTION",
    "SECURITY_BITS",
    "SPARSE_MIN_SITES",
    "NeighbourGraph",
    "choose_neighbours",
    "cohesion_failure_bound",
    "expected_degree",
    "failure_bound",
    "graph_seed",
    "min_neighbours",
    "nonce_commitment",
    "plan_graph",
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
    for site in sorted(nonces):
        nonce = nonces[site]
        if len(nonce) != KEY_BYTES or nonce_commitment(round_id, site, nonce) != commitments[site]:
            raise SecAggError(f"the graph nonce of {site!r} does not open its commitment")
        fields += [site.encode(), nonce]
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
    if len(seed) != KEY_BYTES:
        raise ValueError(f"the graph seed is {KEY_BYTES} bytes, got {len(seed)}")
    if not 2 <= sites <= MAX_SITES:
        raise ValueError(f"sites must lie in [2, {MAX_SITES}], got {sites}")
    if not 1 <= k <= sites - 1:
        raise ValueError(f"k must lie in [1, {sites - 1}] with {sites} sites, got {k}")
    key = hashlib.sha256(encode_fields(_CHOICE_LABEL, seed)).digest()
    words = prg_words(key, sites * sites).reshape(sites, sites)
    index = np.arange(sites, dtype=np.uint64)
    keys = (words & ~np.uint64(0xFFFF)) | index[None, :]
    keys[index.astype(np.int64), index.astype(np.int64)] = np.iinfo(np.uint64).max
    chosen = np.argpartition(keys, k - 1, axis=1)[:, :k]
    return np.sort(chosen, axis=1).astype(np.int64)


class NeighbourGraph:
    """A round's k-out graph: each site's neighbours and per-neighbourhood threshold.

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
    def build(cls, sites: Sequence[str], seed: bytes, k: int, allowance: int) -> NeighbourGraph:
        """The graph of ``sites`` from ``seed`` (:func:`choose_neighbours`).

        Raises
        ------
        ValueError
            As :func:`choose_neighbours`.
        """
        n = len(sites)
        choices = choose_neighbours(seed, n, k)
        adjacency = np.zeros((n, n), dtype=bool)
        adjacency[np.repeat(np.arange(n), k), choices.ravel()] = True
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


def expected_degree(sites: int, k: int) -> float:
    """Mean number of neighbours of a site in the k-out graph: ``k + (S - 1 - k) k / (S - 1)``."""
    return k + (sites - 1 - k) * k / (sites - 1)


def _check_args(sites: int, colluders: int, k: int, allowance: int) -> None:
    if not 2 <= sites <= MAX_SITES:
        raise ValueError(f"sites must lie in [2, {MAX_SITES}], got {sites}")
    if not 0 <= colluders <= sites - 1:
        raise ValueError(f"colluders must lie in [0, {sites - 1}], got {colluders}")
    if not 1 <= k <= sites - 1:
        raise ValueError(f"k must lie in [1, {sites - 1}], got {k}")
    if allowance < 0:
        raise ValueError(f"the dropout allowance must be >= 0, got {allowance}")


@functools.lru_cache(maxsize=256)
def secrecy_failure_bound(sites: int, colluders: int, k: int, allowance: int) -> float:
    """Upper bound on the probability that Condition A fails at some honest site.

    ``S_H * sum_a Hyp(a; S - 1, S_C, k) * Bin(<= 2 Delta - 1 - (k - a); S_H - 1 - (k - a), q)``
    with ``q = k / (S - 1)`` (module docstring).

    Parameters
    ----------
    sites, colluders, k, allowance : int
        ``S``, ``S_C``, ``k``, ``Delta``.

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
    honest = sites - colluders
    q = k / (sites - 1)
    a = np.arange(0, min(colluders, k) + 1)
    limit = 2 * allowance - 1 - (k - a)
    pa = hypergeom.pmf(a, sites - 1, colluders, k)
    tail = np.where(limit >= 0, binom.cdf(limit, honest - 1 - (k - a), q), 0.0)
    return float(honest * np.sum(pa * tail))


def _log_choose(n: int, s: np.ndarray) -> np.ndarray:
    return gammaln(n + 1) - gammaln(s + 1) - gammaln(n - s + 1)


@functools.lru_cache(maxsize=256)
def cohesion_failure_bound(sites: int, colluders: int, k: int, allowance: int) -> float:
    """Upper bound on the probability that Condition B fails: that some set of at most half the
    honest sites keeps all but ``Delta`` of every member's honest neighbours.

    ``sum_{s=1}^{floor(S_H / 2)} C(S_H, s) P[f <= Delta]^s``, ``P[f <= Delta] = sum_a
    Hyp(a; S - 1, S_H - s, k) Bin(<= Delta - a; S_H - s - a, q)`` (module docstring).

    Parameters
    ----------
    sites, colluders, k, allowance : int
        ``S``, ``S_C``, ``k``, ``Delta``.

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
    honest = sites - colluders
    if honest < 2:
        return 0.0
    q = k / (sites - 1)
    s = np.arange(1, honest // 2 + 1)
    outside = (honest - s)[:, None]
    a = np.arange(0, min(allowance, k) + 1)[None, :]
    pa = hypergeom.pmf(a, sites - 1, outside, k)
    tail = binom.cdf(allowance - a, np.maximum(outside - a, 0), q)
    p = np.sum(np.where(a <= outside, pa * tail, 0.0), axis=1)
    with np.errstate(divide="ignore"):
        logs = _log_choose(honest, s) + s * np.log(np.minimum(p, 1.0))
    finite = logs[np.isfinite(logs)]
    return float(np.exp(logsumexp(finite))) if finite.size else 0.0


def failure_bound(sites: int, colluders: int, k: int, allowance: int) -> float:
    """``secrecy_failure_bound + cohesion_failure_bound``: the probability, over the graph, that
    the curator and ``colluders`` colluding sites can learn more than one sum over more than half
    of the honest sites (module docstring). Valid rounds have it at most ``2^-SECURITY_BITS``.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    return secrecy_failure_bound(sites, colluders, k, allowance) + cohesion_failure_bound(
        sites, colluders, k, allowance
    )


@functools.lru_cache(maxsize=256)
def min_neighbours(
    sites: int, colluders: int, allowance: int, bits: int = SECURITY_BITS
) -> int | None:
    """The least ``k`` whose graph meets ``failure_bound <= 2^-bits``, or ``None`` below ``S - 1``.

    Parameters
    ----------
    sites : int
        ``S >= 3``.
    colluders : int
        ``S_C`` in ``[0, S - 1]``.
    allowance : int
        ``Delta >= 0``: the lost sites every neighbourhood must tolerate.
    bits : int, default 40

    Returns
    -------
    int or None
        ``k`` in ``[Delta + 1, S - 2]`` (``t_v >= 2`` needs ``k >= Delta + 1``), or ``None``
        when only the complete graph reaches the bound.

    Raises
    ------
    ValueError
        If a parameter is out of range.
    """
    _check_args(sites, colluders, 1, allowance)
    target = 2.0**-bits
    for k in range(allowance + 1, sites - 1):
        if failure_bound(sites, colluders, k, allowance) <= target:
            return k
    return None


@dataclass(frozen=True)
class GraphPlan:
    """A sparse round's graph parameters (:func:`plan_graph`).

    Attributes
    ----------
    neighbours : int
        ``k``: choices per site.
    allowance : int
        ``Delta``: lost sites tolerated per neighbourhood.
    failure : float
        :func:`failure_bound` of the plan, at most ``2^-40``.
    """

    neighbours: int
    allowance: int
    failure: float


def plan_graph(
    sites: int, colluders: int, allowance: int, *, bits: int = SECURITY_BITS
) -> GraphPlan | None:
    """The sparse graph for a round of ``sites`` sites, or ``None`` for the complete graph.

    The sparse graph is used from :data:`SPARSE_MIN_SITES` sites, when a ``k`` meets the
    security target (:func:`min_neighbours`) with a mean degree of at most
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
    k = min_neighbours(sites, colluders, allowance, bits)
    if k is None or expected_degree(sites, k) > MAX_DEGREE_FRACTION * (sites - 1):
        return None
    return GraphPlan(k, allowance, failure_bound(sites, colluders, k, allowance))
