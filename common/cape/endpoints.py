"""What the curator needs from an owner in a CAPE job, independent of transport.

A CAPE site is also a secure-aggregation site (:class:`dpmarket.common.secagg.endpoints.
SecureAggregationEndpoint`): the job's zero-sum noise round runs through it. Implementations: an
in-process adapter (``dpmarket.owner.local``) and a gRPC client (``dpmarket.curator.owners``); both
raise the errors of :mod:`dpmarket.common.errors`, a transport failure being
:class:`dpmarket.common.errors.UnavailableError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import SizeAttestation
from dpmarket.common.cape.spec import AnyCapeSpec
from dpmarket.common.market.terms import MarketTerms
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.secagg.endpoints import SecureAggregationEndpoint


@dataclass(frozen=True)
class OpenedJob:
    """What a site answers when a job opens (public values).

    Attributes
    ----------
    rows : int
        The site's row count ``N_s``.
    min_colluders : int
        Its owner's policy floor on ``S_C``: the job's ``S_C`` must be at least every site's.
    """

    rows: int
    min_colluders: int


class CapeSiteEndpoint(SecureAggregationEndpoint, Protocol):
    """One owner as a CAPE site (the CAPE paper's Algorithms 1, 2 and 4, and Section 5.1's
    gradient descent)."""

    async def schema(self) -> Schema | None:
        """The owner's public schema (``None``: it declared none)."""
        ...

    async def open_job(
        self,
        job_id: str,
        spec: AnyCapeSpec,
        seed: int,
        consumer: str,
        market: MarketTerms | None = None,
    ) -> OpenedJob:
        """Open a job; return the site's row count and its floor on ``S_C``. ``market``: the
        site's line of the job's quote (None: unquoted, refused by an owner with prices)."""
        ...

    async def attest_plan(
        self, job_id: str, sites: Sequence[str], colluders: int, first_iteration: int = 0
    ) -> tuple[SizeAttestation, bytes]:
        """The site's row count signed for this plan, and its certificate (PEM; empty
        in-process)."""
        ...

    async def plan_job(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        attestations: Mapping[str, tuple[SizeAttestation, bytes]],
        first_iteration: int = 0,
    ) -> tuple[int, float]:
        """Fix the round's sites, ``S_C`` and signed row counts (for a training, from
        ``first_iteration`` on); return the statistic's length (one iteration's for a training)
        and the site's largest noise standard deviation."""
        ...

    async def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """The site's release ``Lambda_s + e_s + g_s``, shape (statistic_length,)."""
        ...

    async def release_gradient(
        self,
        job_id: str,
        round_id: bytes,
        iteration: int,
        parameters: NDArray[np.float64],
        total: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """A training's release at ``iteration``: the clipped-gradient average at
        ``parameters`` plus zero-sum and local noise, shape (P,)."""
        ...

    async def close_job(self, job_id: str) -> SessionSpend:
        """Forget the job; what the site's ledger recorded for it."""
        ...
