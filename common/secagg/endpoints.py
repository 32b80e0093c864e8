"""What the aggregator needs from a site in a secure-aggregation round, independent of transport.

The curator drives a round (:mod:`dpmarket.curator.secagg`) through these endpoints: an in-process
adapter around an owner's :class:`dpmarket.owner.secagg.SiteRounds` or a gRPC client. Both raise the
errors of :mod:`dpmarket.common.errors`; a transport failure is
:class:`dpmarket.common.errors.UnavailableError` and makes the site a dropout at that stage.
Complete-graph rounds (Bonawitz et al.) use five of the calls; sparse rounds (SecAgg+,
:mod:`dpmarket.common.secagg.sparse`) also :meth:`reveal_nonce`, and the pairwise tags of
:class:`MaskedInput` and :class:`SurvivorAttestation`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse


@dataclass(frozen=True)
class MaskedInput:
    """A site's Round 2 answer.

    Attributes
    ----------
    vector : ndarray of shape (vector_length,), uint64
        The masked input, values mod ``2^k``.
    acknowledgements : dict of str to bytes
        Sparse rounds: neighbour -> this site's acknowledgement that it masked with it
        (:attr:`dpmarket.common.secagg.sparse.SparseSecAggSite.acknowledgements`); empty otherwise.
    """

    vector: NDArray[np.uint64]
    acknowledgements: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class SurvivorAttestation:
    """A site's Round 3 (ConsistencyCheck) answer.

    Attributes
    ----------
    signature : bytes
        Complete-graph rounds: the site's signature of the survivor list; empty in sparse rounds.
    tags : dict of str to bytes
        Sparse rounds: surviving neighbour -> this site's tag of the list; empty otherwise.
    """

    signature: bytes = b""
    tags: dict[str, bytes] = field(default_factory=dict)


class SecureAggregationEndpoint(Protocol):
    """One site of a round, as the aggregator sees it (Bonawitz et al. 2017, Figure 4; Bell et
    al. 2020 for sparse rounds)."""

    @property
    def name(self) -> str:
        """The site id (the owner's name)."""
        ...

    async def advertise_keys(
        self, job_id: str, params: RoundParams
    ) -> tuple[KeyAdvertisement, bytes]:
        """Round 0: the site's signed keys and its certificate (PEM; empty in-process)."""
        ...

    async def reveal_nonce(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> bytes:
        """Sparse rounds: the site's 32-byte graph nonce, given every advertisement."""
        ...

    async def share_keys(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
        nonces: Mapping[str, bytes] | None = None,
    ) -> dict[str, bytes]:
        """Round 1: recipient -> AEAD ciphertext of this site's shares. Sparse rounds pass the
        nonces (and no advertisements: they came with :meth:`reveal_nonce`)."""
        ...

    async def masked_input(
        self, job_id: str, params: RoundParams, ciphertexts: Mapping[str, bytes]
    ) -> MaskedInput:
        """Round 2: the site's masked input (and, sparse, its acknowledgements)."""
        ...

    async def consistency_check(
        self, job_id: str, params: RoundParams, survivors: Sequence[str]
    ) -> SurvivorAttestation:
        """Round 3: the site's signature (or, sparse, pairwise tags) of ``U3``."""
        ...

    async def unmask(
        self,
        job_id: str,
        params: RoundParams,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
        acknowledgements: Mapping[str, bytes] | None = None,
    ) -> UnmaskResponse:
        """Round 4: the shares the aggregator needs, once the site has checked ``t`` survivors'
        signatures of ``U3`` (``signatures``: signer -> signature; sparse rounds: neighbour ->
        its tag addressed to this site, with the acknowledgements addressed to it)."""
        ...
