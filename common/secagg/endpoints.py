"""What the aggregator needs from a site in a secure-aggregation round, independent of transport.

The curator drives a round (:mod:`curator.secagg`) through these endpoints: an in-process adapter
around an owner's :class:`owner.secagg.SiteRounds` or a gRPC client. Both raise the errors of
:mod:`common.errors`; a transport failure is :class:`common.errors.UnavailableError` and makes the
site a dropout at that stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse


class SecureAggregationEndpoint(Protocol):
    """One site of a round, as the aggregator sees it (Bonawitz et al. 2017, Figure 4)."""

    @property
    def name(self) -> str:
        """The site id (the owner's name)."""
        ...

    async def advertise_keys(
        self, job_id: str, params: RoundParams
    ) -> tuple[KeyAdvertisement, bytes]:
        """Round 0: the site's signed keys and its certificate (PEM; empty in-process)."""
        ...

    async def share_keys(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> dict[str, bytes]:
        """Round 1: recipient -> AEAD ciphertext of this site's shares."""
        ...

    async def masked_input(
        self, job_id: str, params: RoundParams, ciphertexts: Mapping[str, bytes]
    ) -> NDArray[np.uint64]:
        """Round 2: the site's masked input, shape (vector_length,), values mod 2^k."""
        ...

    async def consistency_check(
        self, job_id: str, params: RoundParams, survivors: Sequence[str]
    ) -> bytes:
        """Round 3: the site's signature of the survivor list ``U3``."""
        ...

    async def unmask(
        self,
        job_id: str,
        params: RoundParams,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
    ) -> UnmaskResponse:
        """Round 4: the shares the aggregator needs, once the site has checked ``t`` survivors'
        signatures of ``U3`` (``signatures``: signer -> signature)."""
        ...
