"""The public parameters of a secure-aggregation round (Bonawitz et al., CCS 2017, §4; Bell et al.,
CCS 2020, for the sparse graph): :class:`RoundParams` and the threshold rule.

Kept apart from :mod:`dpmarket.common.secagg.protocol` so that the sites' shared base
(:mod:`dpmarket.common.secagg.base`) and the protocol both read them without an import circle.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from dpmarket.common.secagg import graph
from dpmarket.common.secagg.crypto import (
    RandomBytes,
    encode_fields,
)
from dpmarket.common.secagg.fixedpoint import FixedPoint

__all__ = ["ROUND_ID_BYTES", "DropStage", "RoundParams", "min_threshold"]

#: Minimum length of a round id (random bytes chosen by the aggregator).
ROUND_ID_BYTES = 16
_PARAMS_LABEL = b"dpmarket/secagg/v1/round-params"

DropStage = Literal["advertise", "reveal", "share", "mask", "check", "unmask"]


def min_threshold(sites: int, colluders: int = 0) -> int:
    """The smallest threshold a round of ``sites`` sites may use against ``colluders`` colluders.

    Parameters
    ----------
    sites : int
        ``n >= 2``.
    colluders : int, default 0
        ``S_C`` in ``[0, n - 1]``: sites that may collude with the aggregator.

    Returns
    -------
    int
        ``max(2, floor((n + S_C) / 2) + 1)``: the least ``t`` with ``2 t > n + S_C`` (see
        :class:`RoundParams`); ``floor(n / 2) + 1`` without colluders, 4 for ``n = 5, S_C = 1``,
        13 for ``n = 20, S_C = 5``, 14 for ``n = 20, S_C = 6``.

    Raises
    ------
    ValueError
        If ``sites < 2`` or ``colluders`` is outside ``[0, n - 1]``.
    """
    if isinstance(sites, bool) or not isinstance(sites, int) or sites < 2:
        raise ValueError(f"a round needs at least 2 sites, got {sites!r}")
    if isinstance(colluders, bool) or not isinstance(colluders, int):
        raise ValueError(f"colluders must be an int, got {colluders!r}")
    if not 0 <= colluders <= sites - 1:
        raise ValueError(
            f"colluders must lie in [0, {sites - 1}] with {sites} sites, got {colluders}"
        )
    return max(2, (sites + colluders) // 2 + 1)


def _check_sparse(
    sites: int, threshold: int, colluders: int, k: int, allowance: int, ring: int
) -> None:
    """Validate a sparse round's graph parameters (:class:`RoundParams`)."""
    if threshold != 0:
        raise ValueError(
            f"a sparse round's thresholds are per neighbourhood: threshold must be 0, got "
            f"{threshold}"
        )
    if not 3 <= sites <= graph.MAX_SITES:
        raise ValueError(f"a sparse round needs 3 to {graph.MAX_SITES} sites, got {sites}")
    if not 1 <= k <= sites - 2:
        raise ValueError(f"neighbours must lie in [1, {sites - 2}] with {sites} sites, got {k}")
    if ring % 2 or ring > sites - 2:
        raise ValueError(
            f"the ring's degree must be even and in [0, {sites - 2}] with {sites} sites, got {ring}"
        )
    if allowance > max(k, ring) - 1:
        raise ValueError(
            f"allowance must lie in [0, max(neighbours, ring) - 1] = [0, {max(k, ring) - 1}] so "
            f"that every threshold is at least 2, got {allowance}"
        )
    bound = graph.failure_bound(sites, colluders, k, allowance, ring)
    if not bound <= 2.0**-graph.SECURITY_BITS:
        raise ValueError(
            f"the sparse graph with k={k} neighbours, a ring of {ring} and allowance {allowance} "
            f"for {sites} sites and S_C={colluders} colluders fails with probability up to "
            f"{bound:.3g}, above 2^-{graph.SECURITY_BITS}: choose the graph with "
            "dpmarket.common.secagg.graph.plan_graph"
        )


@dataclass(frozen=True)
class RoundParams:
    """The public parameters of one round, chosen by the aggregator and known to every party.

    Parameters
    ----------
    round_id : bytes
        At least 16 random bytes, fresh per round (:meth:`create` draws 32). Bound into every
        signature, derived key and associated data, so no message of one round is valid in
        another.
    sites : tuple of str
        The ids of the sites invited to the round (the owners' certificate names). Stored sorted
        (Python ``str`` order, i.e. by code point); that order decides each pairwise mask's sign
        and each site's Shamir x coordinate. No duplicates.
    threshold : int
        ``t``: the fewest sites that must remain at every stage. ``2 <= t <= len(sites)`` and
        ``2 t > len(sites) + colluders`` (:func:`min_threshold` is the least such ``t``).
    vector_length : int
        ``D``: entries in every site's input vector, ``>= 1``.
    fixed_point : FixedPoint
        Encoding of the inputs; ``fixed_point.sites >= len(sites)`` so the sum cannot wrap.
    colluders : int, default 0
        ``S_C``: how many sites may collude with the aggregator (share their secrets and sign
        whatever it asks), ``0 <= S_C <= len(sites) - 1``. Each site refuses a round whose
        ``S_C`` is below what it requires (its owner's policy, its job).
    neighbours : int, default 0
        ``0`` for the complete graph (Bonawitz et al.); ``k >= 1`` for SecAgg+'s sparse graph, in
        which every site chooses ``k`` random neighbours (:mod:`dpmarket.common.secagg.graph`,
        :mod:`dpmarket.common.secagg.sparse`). A sparse round has ``threshold = 0``: its thresholds
        are per neighbourhood, ``t_v = K_v - allowance``.
    allowance : int, default 0
        ``Delta``, sparse rounds only: the lost sites every neighbourhood tolerates,
        ``0 <= Delta <= max(k, ring) - 1``.
    ring : int, default 0
        Sparse rounds only: the even degree of the ring added to the k-out graph (every site also
        joined to the ``ring / 2`` nearest on either side of a random cyclic order), ``0 <= ring
        <= len(sites) - 2``; 0 for none. ``(len(sites), colluders, neighbours, allowance, ring)``
        must meet :func:`dpmarket.common.secagg.graph.failure_bound` ``<= 2^-40``.

    Raises
    ------
    ValueError
        If a parameter is out of range, or a sparse graph misses the security target.

    Notes
    -----
    **Why t > (n + S_C) / 2.** Each honest site answers the unmasking request once, revealing for
    every other site ``v`` either its share of ``v``'s self-mask seed (``v`` survived) or its
    share of ``v``'s pairwise-mask key (``v`` dropped), never both. To learn both secrets of
    ``v``, and with them ``v``'s input, an aggregator must make two groups of sites reveal: one
    that believes ``v`` survived (``U3`` with ``v``) and one that believes ``v`` dropped (a
    ``U3'`` without it). Before it reveals anything, a site checks ``t`` valid signatures, from
    distinct members of the round, on the very ``U3`` it signed (the ConsistencyCheck round), and
    an honest site signs one ``U3`` per round. Two sets of ``t`` signers, one for ``U3`` and one
    for ``U3'``, both drawn from the ``n`` sites, share at least ``2 t - n`` signers, and every
    shared signer signed two survivor lists, so it is one of the ``S_C`` colluders: the attack
    needs ``2 t - n <= S_C``, i.e. ``2 t <= n + S_C``. With ``2 t > n + S_C`` every honest site
    that reveals anything in a round reveals for the same ``U3``, so the aggregator gets at most
    the colluders' ``S_C < t`` shares of the other secret of any site. The same count holds for
    the shares themselves (each secret needs ``t`` of them, each honest site gives one kind): at
    ``n = 5, S_C = 1`` the usual ``t = 3`` lets a curator told ``U3`` apart recover a victim's
    input (tested); ``t = 4`` does not. ``t >= 2``: with ``t = 1`` every share is the secret.

    References
    ----------
    Bonawitz et al. (CCS 2017), Figure 4 (Round 3, ConsistencyCheck) and Section 6 (security
    against an active adversary controlling the server and some users).
    """

    round_id: bytes
    sites: tuple[str, ...]
    threshold: int
    vector_length: int
    fixed_point: FixedPoint
    colluders: int = 0
    neighbours: int = 0
    allowance: int = 0
    ring: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.round_id, bytes) or len(self.round_id) < ROUND_ID_BYTES:
            raise ValueError(f"round_id must be at least {ROUND_ID_BYTES} bytes")
        sites = tuple(self.sites)
        for site in sites:
            if not isinstance(site, str) or not site:
                raise ValueError(f"site ids must be non-empty strings, got {site!r}")
        ordered = tuple(sorted(sites))
        duplicates = sorted({s for s in ordered if ordered.count(s) > 1})
        if duplicates:
            raise ValueError(f"duplicate site ids: {duplicates}")
        object.__setattr__(self, "sites", ordered)
        n = len(ordered)
        t, c = self.threshold, self.colluders
        if isinstance(t, bool) or not isinstance(t, int):
            raise ValueError(f"threshold must be an int, got {t!r}")
        if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= max(n - 1, 0):
            raise ValueError(f"colluders must be an int in [0, n - 1] with n={n} sites, got {c!r}")
        k, a, r = self.neighbours, self.allowance, self.ring
        for name, value in (("neighbours", k), ("allowance", a), ("ring", r)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if k:
            _check_sparse(n, t, c, k, a, r)
        elif a:
            raise ValueError(f"a complete-graph round has no dropout allowance, got {a}")
        elif r:
            raise ValueError(f"a complete-graph round has no ring, got {r}")
        elif t < 2 or t > n or 2 * t <= n + c:
            raise ValueError(
                f"threshold must satisfy 2 <= t <= n and t > (n + S_C) / 2 with n={n} sites and "
                f"S_C={c} colluders, got t={t}"
            )
        d = self.vector_length
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"vector_length must be an int >= 1, got {d!r}")
        if not isinstance(self.fixed_point, FixedPoint):
            raise ValueError(f"fixed_point must be a FixedPoint, got {self.fixed_point!r}")
        if self.fixed_point.sites < n:
            raise ValueError(
                f"fixed_point.sites={self.fixed_point.sites} is below the {n} sites: "
                "their sum could wrap around the modulus"
            )

    @classmethod
    def create(
        cls,
        sites: Iterable[str],
        threshold: int,
        vector_length: int,
        fixed_point: FixedPoint,
        *,
        colluders: int = 0,
        neighbours: int = 0,
        allowance: int = 0,
        ring: int = 0,
        random_bytes: RandomBytes = os.urandom,
    ) -> RoundParams:
        """Parameters with a fresh 32-byte random ``round_id`` (from ``os.urandom`` by default)."""
        return cls(
            round_id=random_bytes(32),
            sites=tuple(sites),
            threshold=threshold,
            vector_length=vector_length,
            fixed_point=fixed_point,
            colluders=colluders,
            neighbours=neighbours,
            allowance=allowance,
            ring=ring,
        )

    @property
    def sparse(self) -> bool:
        """Whether the round runs on SecAgg+'s sparse graph (``neighbours > 0``)."""
        return self.neighbours > 0

    @property
    def modulus_bits(self) -> int:
        """``k``: masked vectors and sums are integers modulo ``2^k``."""
        return self.fixed_point.modulus_bits

    @functools.cached_property
    def digest(self) -> bytes:
        """SHA-256 of every parameter (32 bytes), bound into the signed survivor list.

        Two sites that accept signatures on the same ``U3`` thereby agree on the round id, the
        sites, ``t``, ``S_C``, ``D``, the encoding and (sparse rounds) ``k``, ``Delta`` and the
        ring, whatever the aggregator told each.
        """
        fp = self.fixed_point
        fields = [
            _PARAMS_LABEL,
            self.round_id,
            str(self.threshold).encode(),
            str(self.colluders).encode(),
            str(self.vector_length).encode(),
            float(fp.clip).hex().encode(),
            str(fp.resolution_bits).encode(),
            str(fp.sites).encode(),
            *(site.encode() for site in self.sites),
        ]
        if self.sparse:
            fields += [b"sparse", str(self.neighbours).encode(), str(self.allowance).encode()]
            if self.ring:
                fields += [b"ring", str(self.ring).encode()]
        return hashlib.sha256(encode_fields(*fields)).digest()
