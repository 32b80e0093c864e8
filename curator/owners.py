"""gRPC client of an owner, seen by the curator as a
:class:`common.summarization.endpoints.OwnerEndpoint`.

The channel is mTLS with the owner's identity checked at the handshake: the curator talks only to
the owner names it was configured with, whatever answers at an address.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
import numpy as np
from numpy.typing import NDArray

from common.summarization.endpoints import OwnerBid, OwnerInfo, ReleasedPoint, SessionSpend
from common.summarization.rff import RFFParams
from common.summarization.terms import OwnerTerms
from curator import convert
from dpmarket.arrays import array_to_proto
from dpmarket.identity import Identity
from dpmarket.serving import GRPC_OPTIONS
from dpmarket.status import error_from_rpc
from dpmarket.transport import TransportSecurity, aio_channel
from dpmarket.v1 import owner_pb2, owner_pb2_grpc

T = TypeVar("T")

#: Deadline of a round-trip call (bids, releases), seconds.
CALL_DEADLINE_SECONDS = 30.0
#: Deadline of OpenSession, which computes the features of every owned point, seconds.
OPEN_DEADLINE_SECONDS = 300.0


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

    @property
    def name(self) -> str:
        """The owner's expected name and address."""
        if self.expected is None:
            return self.target
        return f"{self.expected.name}@{self.target}"

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
        self, session_id: str, embedding: NDArray[np.float64]
    ) -> None:
        """SetValidationEmbedding."""
        request = owner_pb2.SetValidationEmbeddingRequest(
            session_id=session_id, validation_embedding=array_to_proto(embedding)
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

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close(None)
