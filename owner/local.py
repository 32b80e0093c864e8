"""In-process owner endpoints: the curator's view of an owner's objects, without a network.

``dpmarket lab simulate``, the tests and the benchmarks run the whole protocol in one process
through this adapter; the networked run goes through ``dpmarket.curator.owners.GrpcOwnerEndpoint``
instead, and both give the same summary for the same seeds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import SizeAttestation
from dpmarket.common.cape.endpoints import OpenedJob
from dpmarket.common.cape.spec import AnyCapeSpec
from dpmarket.common.market.pricing import OwnerPrices
from dpmarket.common.market.terms import FREE, MarketTerms
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.common.schema import Schema
from dpmarket.common.secagg.endpoints import MaskedInput, SurvivorAttestation
from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse
from dpmarket.common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from dpmarket.common.summarization.hashes import HashAdvert
from dpmarket.common.summarization.rff import RFFParams
from dpmarket.common.summarization.terms import OwnerTerms
from dpmarket.owner.cape import CapeSite
from dpmarket.owner.protocol import LOCAL_CURATOR, Owner
from dpmarket.owner.secagg import SiteRounds


class LocalOwnerEndpoint:
    """Async adapter that calls an in-process :class:`Owner` directly."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    @property
    def name(self) -> str:
        """The owner id."""
        return self.owner.owner_id

    async def info(self) -> OwnerInfo:
        """See :meth:`Owner.info`."""
        return self.owner.info()

    async def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        consumer: str,
        terms: OwnerTerms,
    ) -> tuple[int, int]:
        """See :meth:`Owner.open_session`."""
        return self.owner.open_session(
            session_id, rff, sampling_seed, consumer=consumer, terms=terms
        )

    async def set_validation_embedding(
        self,
        session_id: str,
        embedding: NDArray[np.float64],
        *,
        shrinkage_sigma: float = 0.0,
        prior_embedding: NDArray[np.float64] | None = None,
        score_metric: bool = False,
    ) -> None:
        """See :meth:`OwnerSession.set_validation_embedding`."""
        self.owner.set_validation_embedding(
            session_id,
            embedding,
            shrinkage_sigma=shrinkage_sigma,
            prior_embedding=prior_embedding,
            score_metric=score_metric,
        )

    async def bid(
        self, session_id: str, round_: int, summary_embedding: NDArray[np.float64], q: int
    ) -> OwnerBid | None:
        """See :meth:`Owner.bid`."""
        return self.owner.bid(session_id, round_, summary_embedding, q)

    async def progress(self, session_id: str) -> tuple[str, int, int, int]:
        """See :meth:`Owner.progress`."""
        return self.owner.progress(session_id)

    async def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """See :meth:`Owner.release_point`."""
        return self.owner.release_point(session_id, round_)

    async def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """See :meth:`Owner.sample_uniform`."""
        return self.owner.sample_uniform(session_id, count)

    async def count_relevant(self, session_id: str, threshold: float) -> float:
        """See :meth:`OwnerSession.noisy_relevant_count`."""
        return self.owner.noisy_relevant_count(session_id, threshold)

    async def propose_candidates(
        self, session_id: str, count: int, *, uniform_count: int = 0
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """See :meth:`Owner.propose_candidates`."""
        return self.owner.propose_candidates(session_id, count, uniform_count=uniform_count)

    async def close_session(self, session_id: str) -> SessionSpend:
        """See :meth:`Owner.close_session`."""
        return self.owner.close_session(session_id)

    async def hash_advertise(self, session_id: str) -> HashAdvert:
        """See :meth:`Owner.hash_advertise`."""
        return self.owner.hash_advertise(session_id)

    async def hash_distribute(
        self, session_id: str, adverts: Mapping[str, HashAdvert]
    ) -> dict[str, tuple[bytes, bytes]]:
        """See :meth:`Owner.hash_distribute`."""
        return self.owner.hash_distribute(session_id, adverts)

    async def hash_receive(
        self, session_id: str, adverts: Mapping[str, HashAdvert], envelope: tuple[bytes, bytes]
    ) -> str:
        """See :meth:`Owner.hash_receive`."""
        return self.owner.hash_receive(session_id, adverts, envelope)

    async def propose_hashes(
        self, session_id: str, count: int, gamma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """See :meth:`Owner.propose_hashes`."""
        return self.owner.propose_hashes(session_id, count, gamma)


class LocalSecureAggregationEndpoint:
    """Async adapter that calls an in-process owner's :class:`dpmarket.owner.secagg.SiteRounds`."""

    def __init__(self, name: str, rounds: SiteRounds) -> None:
        self._name = name
        self.rounds = rounds

    @property
    def name(self) -> str:
        """The site id."""
        return self._name

    async def advertise_keys(
        self, job_id: str, params: RoundParams
    ) -> tuple[KeyAdvertisement, bytes]:
        """See :meth:`SiteRounds.advertise`."""
        return self.rounds.advertise(job_id, params)

    async def reveal_nonce(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> bytes:
        """See :meth:`SiteRounds.reveal`."""
        return self.rounds.reveal(job_id, params.round_id, advertisements, certificates)

    async def share_keys(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
        nonces: Mapping[str, bytes] | None = None,
    ) -> dict[str, bytes]:
        """See :meth:`SiteRounds.share`."""
        return self.rounds.share(job_id, params.round_id, advertisements, certificates, nonces)

    async def masked_input(
        self, job_id: str, params: RoundParams, ciphertexts: Mapping[str, bytes]
    ) -> MaskedInput:
        """See :meth:`SiteRounds.masked`."""
        return self.rounds.masked(job_id, params.round_id, ciphertexts)

    async def consistency_check(
        self, job_id: str, params: RoundParams, survivors: Sequence[str]
    ) -> SurvivorAttestation:
        """See :meth:`SiteRounds.check`."""
        return self.rounds.check(job_id, params.round_id, survivors)

    async def unmask(
        self,
        job_id: str,
        params: RoundParams,
        survivors: Sequence[str],
        dropped: Sequence[str],
        signatures: Mapping[str, bytes],
        acknowledgements: Mapping[str, bytes] | None = None,
    ) -> UnmaskResponse:
        """See :meth:`SiteRounds.unmask`."""
        return self.rounds.unmask(
            job_id, params.round_id, survivors, dropped, signatures, acknowledgements
        )


class LocalCapeSiteEndpoint(LocalSecureAggregationEndpoint):
    """Async adapter over an in-process owner's CAPE jobs and secure-aggregation rounds."""

    def __init__(self, site: CapeSite, rounds: SiteRounds) -> None:
        super().__init__(site.name, rounds)
        self.site = site

    async def schema(self) -> Schema | None:
        """The schema of the site's table (:attr:`dpmarket.runtime.tables.Table.schema`)."""
        return None if self.site.table is None else self.site.table.schema

    async def prices(self) -> OwnerPrices:
        """The prices of the site's ledger's policy (free without a ledger)."""
        return FREE if self.site.ledger is None else self.site.ledger.policy.prices

    async def open_job(
        self,
        job_id: str,
        spec: AnyCapeSpec,
        seed: int,
        consumer: str,
        market: MarketTerms | None = None,
    ) -> OpenedJob:
        """See :meth:`CapeSite.open`."""
        rows = self.site.open(
            job_id, spec, seed, curator=LOCAL_CURATOR, consumer=consumer, market=market
        )
        return OpenedJob(rows, self.site.min_colluders)

    async def attest_plan(
        self, job_id: str, sites: Sequence[str], colluders: int, first_iteration: int = 0
    ) -> tuple[SizeAttestation, bytes]:
        """See :meth:`CapeSite.attest`."""
        return self.site.attest(
            job_id, sites, colluders, curator=LOCAL_CURATOR, first_iteration=first_iteration
        )

    async def plan_job(
        self,
        job_id: str,
        sites: Sequence[str],
        colluders: int,
        attestations: Mapping[str, tuple[SizeAttestation, bytes]],
        first_iteration: int = 0,
    ) -> tuple[int, float]:
        """See :meth:`CapeSite.plan`."""
        plan = self.site.plan(
            job_id,
            sites,
            colluders,
            {s: a for s, (a, _) in attestations.items()},
            {s: c for s, (_, c) in attestations.items()},
            curator=LOCAL_CURATOR,
            first_iteration=first_iteration,
        )
        index = list(sites).index(self.site.name)
        return plan.size, float(plan.entry_scales(index).max())

    async def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """See :meth:`CapeSite.release`."""
        return self.site.release(job_id, round_id, total, curator=LOCAL_CURATOR)

    async def release_gradient(
        self,
        job_id: str,
        round_id: bytes,
        iteration: int,
        parameters: NDArray[np.float64],
        total: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """See :meth:`CapeSite.release_gradient`."""
        return self.site.release_gradient(
            job_id, round_id, iteration, parameters, total, curator=LOCAL_CURATOR
        )

    async def close_job(self, job_id: str) -> SessionSpend:
        """See :meth:`CapeSite.close`."""
        return self.site.close(job_id, curator=LOCAL_CURATOR)
