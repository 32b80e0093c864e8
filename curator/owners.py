"""gRPC client of an owner, seen by the curator as a
:class:`common.summarization.endpoints.OwnerEndpoint` and, on the same channel, a
:class:`common.cape.endpoints.CapeSiteEndpoint` (CAPE and secure aggregation).

The channel is mTLS with the owner's identity checked at the handshake: the curator talks only to
the owner names it was configured with, whatever answers at an address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray

from common.cape.spec import AnyCapeSpec
from common.errors import FailedPreconditionError, UnavailableError
from common.privacy.ledger import SessionSpend
from common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse
from common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint
from common.summarization.hashes import HashAdvert
from common.summarization.rff import RFFParams
from common.summarization.terms import OwnerTerms
from curator import convert
from dpmarket.v1 import (
    cape_pb2,
    cape_pb2_grpc,
    owner_pb2,
    owner_pb2_grpc,
    secure_aggregation_pb2,
    secure_aggregation_pb2_grpc,
)
from runtime import cape_messages as msg
from runtime.arrays import array_to_proto
from runtime.identity import Identity
from runtime.serving import GRPC_OPTIONS
from runtime.status import error_from_rpc
from runtime.transport import TransportSecurity, aio_channel

T = TypeVar("T")

#: Deadline of a round-trip call (bids, releases), seconds.
CALL_DEADLINE_SECONDS = 30.0
#: Deadline of OpenSession, which computes the features of every owned point, seconds.
OPEN_DEADLINE_SECONDS = 300.0


#: Why a networked session refuses the hashes mode.
_HASHES_IN_PROCESS = (
    "the hashes summary (the less-trusted curator) runs in process only in this release: no "
    "RPC carries the owners' key agreement or their hashes"
)


class GrpcOwnerEndpoint:
    """Talks to one owner service over a ``grpc.aio`` channel, with a deadline on every call.

    Parameters
    ----------
    target : str
        ``host:port`` of the owner service.
    security : TransportSecurity
        The curator's mTLS credentials (or plaintext, ``--insecure`` only).
    expected : Identity, optional
        The owner identity the server must prove (its certificate's role and name); required
        with mTLS.
    deadline : float
        Deadline of round-trip calls, seconds.
    """

    def __init__(
        self,
        target: str,
        security: TransportSecurity,
        expected: Identity | None,
        *,
        deadline: float = CALL_DEADLINE_SECONDS,
    ) -> None:
        self.target = target
        self.expected = expected
        self.deadline = deadline
        self._channel = aio_channel(target, security, expected, options=GRPC_OPTIONS)
        self._stub = owner_pb2_grpc.OwnerServiceStub(self._channel)
        self._secagg = secure_aggregation_pb2_grpc.SecureAggregationServiceStub(self._channel)
        self._cape = cape_pb2_grpc.CapeSiteServiceStub(self._channel)

    @property
    def name(self) -> str:
        """The owner's name (its certificate's; the address with plaintext transport), which
        is also its site id in secure aggregation."""
        if self.expected is None:
            return self.target
        return self.expected.name

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        try:
            return await make()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc, f"owner at {self.target}") from None

    async def info(self) -> OwnerInfo:
        """GetOwnerInfo."""
        response = await self._call(
            lambda: self._stub.GetOwnerInfo(owner_pb2.GetOwnerInfoRequest(), timeout=self.deadline)
        )
        return convert.info_from_proto(response)

    async def open_session(
        self,
        session_id: str,
        rff: RFFParams,
        sampling_seed: int,
        *,
        consumer: str,
        terms: OwnerTerms,
    ) -> tuple[int, int]:
        """OpenSession: offer the terms, send h1's frequencies and phases as data."""
        request = owner_pb2.OpenSessionRequest(
            session_id=session_id,
            omega=array_to_proto(rff.omega),
            phase=array_to_proto(rff.phase),
            sampling_seed=sampling_seed,
            gamma=rff.gamma,
            consumer=consumer,
            terms=convert.terms_to_proto(terms),
        )
        response = await self._call(
            lambda: self._stub.OpenSession(request, timeout=OPEN_DEADLINE_SECONDS)
        )
        return int(response.num_points), int(response.max_points)

    async def set_validation_embedding(
        self, session_id: str, embedding: NDArray[np.float64], *, shrinkage_sigma: float = 0.0
    ) -> None:
        """SetValidationEmbedding."""
        request = owner_pb2.SetValidationEmbeddingRequest(
            session_id=session_id,
            validation_embedding=array_to_proto(embedding),
            shrinkage_sigma=shrinkage_sigma,
        )
        await self._call(lambda: self._stub.SetValidationEmbedding(request, timeout=self.deadline))

    async def bid(
        self, session_id: str, round_: int, summary_embedding: NDArray[np.float64], q: int
    ) -> OwnerBid | None:
        """Bid."""
        request = owner_pb2.BidRequest(
            session_id=session_id,
            round=round_,
            summary_embedding=array_to_proto(summary_embedding),
            summary_size=q,
        )
        response = await self._call(lambda: self._stub.Bid(request, timeout=self.deadline))
        return convert.bid_from_proto(response)

    async def release_point(self, session_id: str, round_: int) -> ReleasedPoint:
        """ReleasePoint."""
        request = owner_pb2.ReleasePointRequest(session_id=session_id, round=round_)
        response = await self._call(lambda: self._stub.ReleasePoint(request, timeout=self.deadline))
        return convert.released_from_proto(response)

    async def sample_uniform(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """SampleUniform."""
        request = owner_pb2.SampleUniformRequest(session_id=session_id, count=count)
        response = await self._call(
            lambda: self._stub.SampleUniform(request, timeout=self.deadline)
        )
        return convert.points_from_proto(response)

    async def count_relevant(self, session_id: str, threshold: float) -> float:
        """CountRelevant: the owner's noisy relevance count."""
        request = owner_pb2.CountRelevantRequest(session_id=session_id, threshold=threshold)
        response = await self._call(
            lambda: self._stub.CountRelevant(request, timeout=self.deadline)
        )
        return float(response.noisy_count)

    async def propose_candidates(
        self, session_id: str, count: int
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """ProposeCandidates (the owner runs a local greedy: allow the open-session deadline)."""
        request = owner_pb2.ProposeCandidatesRequest(session_id=session_id, count=count)
        response = await self._call(
            lambda: self._stub.ProposeCandidates(request, timeout=OPEN_DEADLINE_SECONDS)
        )
        return convert.points_from_proto(response)

    async def close_session(self, session_id: str) -> SessionSpend:
        """CloseSession: what the owner's ledger recorded for the session."""
        request = owner_pb2.CloseSessionRequest(session_id=session_id)
        response = await self._call(lambda: self._stub.CloseSession(request, timeout=self.deadline))
        return convert.spend_from_proto(response.spent)

    async def hash_advertise(self, session_id: str) -> HashAdvert:
        """The hashes mode runs in process only in this release (no RPC carries it)."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def hash_distribute(
        self, session_id: str, adverts: Mapping[str, HashAdvert]
    ) -> dict[str, tuple[bytes, bytes]]:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def hash_receive(
        self, session_id: str, adverts: Mapping[str, HashAdvert], envelope: tuple[bytes, bytes]
    ) -> str:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def propose_hashes(
        self, session_id: str, count: int, gamma: float
    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
        """See :meth:`hash_advertise`."""
        raise FailedPreconditionError(_HASHES_IN_PROCESS)

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)

    async def connect(self, timeout: float = CALL_DEADLINE_SECONDS) -> None:
        """Connect now (TCP and the mTLS handshake, the owner's identity checked) rather than
        at the first call.

        Raises
        ------
        UnavailableError
            If the channel is not connected within ``timeout`` seconds (nobody listens, or the
            server does not prove the expected identity).
        """
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout)
        except TimeoutError:
            raise UnavailableError(
                f"owner at {self.target}: not connected within {timeout} s"
            ) from None

    # ------------------------------------------------------------ secure aggregation (site)
    async def advertise_keys(
        self, job_id: str, params: RoundParams
    ) -> tuple[KeyAdvertisement, bytes]:
        """AdvertiseKeys."""
        request = secure_aggregation_pb2.AdvertiseKeysRequest(
            round=msg.round_to_proto(job_id, params)
        )
        response = await self._call(
            lambda: self._secagg.AdvertiseKeys(request, timeout=self.deadline)
        )
        return msg.advertisement_from_proto(response.advertisement)

    async def share_keys(
        self,
        job_id: str,
        params: RoundParams,
        advertisements: Mapping[str, KeyAdvertisement],
        certificates: Mapping[str, bytes],
    ) -> dict[str, bytes]:
        """ShareKeys."""
        request = secure_aggregation_pb2.ShareKeysRequest(
            round=msg.round_to_proto(job_id, params),
            advertisements=[
                msg.advertisement_to_proto(ad, certificates.get(site, b""))
                for site, ad in sorted(advertisements.items())
            ],
        )
        response = await self._call(lambda: self._secagg.ShareKeys(request, timeout=self.deadline))
        return {c.recipient: bytes(c.ciphertext) for c in response.ciphertexts}

    async def masked_input(
        self, job_id: str, params: RoundParams, ciphertexts: Mapping[str, bytes]
    ) -> NDArray[np.uint64]:
        """MaskedInput."""
        me = self.expected.name if self.expected is not None else ""
        request = secure_aggregation_pb2.MaskedInputRequest(
            round=msg.round_to_proto(job_id, params),
            ciphertexts=msg.ciphertexts_to_proto(
                (sender, me, ct) for sender, ct in sorted(ciphertexts.items())
            ),
        )
        response = await self._call(
            lambda: self._secagg.MaskedInput(request, timeout=self.deadline)
        )
        return msg.masked_from_proto(response.masked, params.vector_length)

    async def unmask(
        self,
        job_id: str,
        params: RoundParams,
        survivors: Sequence[str],
        dropped: Sequence[str],
    ) -> UnmaskResponse:
        """Unmask."""
        request = secure_aggregation_pb2.UnmaskRequest(
            round=msg.round_to_proto(job_id, params),
            survivors=list(survivors),
            dropped=list(dropped),
        )
        response = await self._call(lambda: self._secagg.Unmask(request, timeout=self.deadline))
        return msg.unmask_from_proto(response)

    # ----------------------------------------------------------------------- CAPE (site)
    async def open_job(self, job_id: str, spec: AnyCapeSpec, seed: int, consumer: str) -> int:
        """OpenCapeJob (the owner scans its table: allow the open-session deadline)."""
        request = cape_pb2.OpenCapeJobRequest(job_id=job_id, consumer=consumer, seed=seed)
        msg.job_to_proto(request, spec)
        response = await self._call(
            lambda: self._cape.OpenCapeJob(request, timeout=OPEN_DEADLINE_SECONDS)
        )
        return int(response.num_rows)

    async def plan_job(
        self, job_id: str, sites: Sequence[str], sizes: Sequence[int], first_iteration: int = 0
    ) -> tuple[int, float]:
        """PlanCapeJob."""
        request = cape_pb2.PlanCapeJobRequest(
            job_id=job_id, sites=list(sites), sizes=list(sizes), first_iteration=first_iteration
        )
        response = await self._call(lambda: self._cape.PlanCapeJob(request, timeout=self.deadline))
        return int(response.statistic_length), float(response.max_noise_scale)

    async def release(
        self, job_id: str, round_id: bytes, total: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """ReleaseCape."""
        request = cape_pb2.ReleaseCapeRequest(
            job_id=job_id, round_id=round_id, noise_total=msg.vector_to_proto(total)
        )
        response = await self._call(lambda: self._cape.ReleaseCape(request, timeout=self.deadline))
        return msg.vector_from_proto(response.release, "release", total.shape[0])

    async def release_gradient(
        self,
        job_id: str,
        round_id: bytes,
        iteration: int,
        parameters: NDArray[np.float64],
        total: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """ReleaseCapeGradient."""
        request = cape_pb2.ReleaseCapeGradientRequest(
            job_id=job_id,
            round_id=round_id,
            iteration=iteration,
            parameters=msg.vector_to_proto(parameters),
            noise_total=msg.vector_to_proto(total),
        )
        response = await self._call(
            lambda: self._cape.ReleaseCapeGradient(request, timeout=self.deadline)
        )
        return msg.vector_from_proto(response.release, "release", parameters.shape[0])

    async def close_job(self, job_id: str) -> SessionSpend:
        """CloseCapeJob."""
        request = cape_pb2.CloseCapeJobRequest(job_id=job_id)
        response = await self._call(lambda: self._cape.CloseCapeJob(request, timeout=self.deadline))
        return convert.spend_from_proto(response.spent)
